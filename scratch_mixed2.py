"""Scratch: which first-time costs hit mixed steps (cuDNN SDPA plans per shape, Triton JIT variants)."""
import time, sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
compiles = []
try:
    import triton
    def hook(*a, **k):
        fn = k.get("fn"); compiles.append(getattr(getattr(fn, "fn", fn), "__name__", str(fn)))
        return False
    triton.knobs.runtime.jit_post_compile_hook = hook
    print("hook set", flush=True)
except Exception as ex:
    print("no hook", ex)

def t(fn):
    torch.cuda.synchronize(); s = time.perf_counter(); fn(); torch.cuda.synchronize(); return round(1000 * (time.perf_counter() - s), 2)

for be in ("default", "flash", "efficient"):
    out = []
    for L in (500, 501, 512, 700, 1000, 333, 500, 512):
        q = torch.randn(1, 32, L, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, 8, L, 128, device="cuda", dtype=torch.bfloat16)
        f = lambda: F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
        try:
            if be == "default":
                out.append((L, t(f), t(f)))
            else:
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION if be == "flash" else SDPBackend.EFFICIENT_ATTENTION):
                    out.append((L, t(f), t(f)))
        except Exception as ex:
            out.append((L, "err", str(ex)[:80]))
    print("sdpa", be, out, flush=True)

from blitzscale.checkpoint import load_weights, resolve_model
from blitzscale.engine import LLMEngine, SamplingParams
from blitzscale.serve.config import SERVE_ENGINE
w = load_weights(resolve_model("random:llama3-8b"), dtype=torch.bfloat16, device="cuda")
e = LLMEngine(w, None, SERVE_ENGINE.for_device("cuda"))
V = e.model_config.vocab_size
g = torch.Generator().manual_seed(0)
def P(n): return torch.randint(0, V, (n,), generator=g).tolist()
params = SamplingParams(max_tokens=100000, temperature=0, ignore_eos=True)
for _ in range(60): e.add_request(P(512), params)
while e.scheduler.waiting: e.step()
for _ in range(30): e.step()
e._settle()
print("compiles so far", len(compiles), sorted(set(compiles)), flush=True)
def run(lengths, tag):
    out = []
    for L in lengths:
        n0 = len(compiles)
        def f():
            e.add_request(P(L), params); e.step(); e._settle()
        ms = t(f)
        out.append((L, ms, len(compiles) - n0))
        rid = e.request_ids()[-1]; e.abort(rid); e.step(); e._settle()
    print(tag, out, flush=True)
lens = [100, 200, 333, 512, 777, 1000, 1500, 64, 900]
run(lens, "mixed cold (len, ms, new triton compiles)")
run(lens, "mixed warm")
torch.backends.cuda.enable_cudnn_sdp(False)
lens2 = [101, 203, 334, 513, 779, 1001, 1501, 65, 901]
run(lens2, "no-cudnn new lengths")
run(lens2, "no-cudnn warm")
print("compiles", len(compiles), sorted(set(compiles)))
