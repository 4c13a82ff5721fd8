# Scratch experiment (not a blitzscale command), run once on nvidia-h200 at 9938cbe; it reads the
# BlockPool free list of that commit (`_free`), which the prefix cache has since replaced.
# Experiment: decode step time at batch 256 with the KV blocks contiguous vs scattered over the cache.
import collections, json, random, sys, time
import torch
from blitzscale.checkpoint import load_weights, resolve_model
from blitzscale.engine import LLMEngine, SamplingParams
from blitzscale.serve.config import SERVE_ENGINE

w = load_weights(resolve_model("random:llama3-8b"), dtype=torch.bfloat16, device="cuda")
e = LLMEngine(w, None, SERVE_ENGINE.for_device("cuda"))
g = torch.Generator().manual_seed(0)
out = {"num_blocks": e.pool.num_blocks, "block_size": e.config.block_size}

def decode_ms(batch, ctx, label):
    p = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    ids = [e.add_request(torch.randint(0, 1000, (ctx,), generator=g).tolist(), p) for _ in range(batch)]
    while any((r := e.request(i)) is not None and r.num_output_tokens == 0 for i in ids):
        e.step()
    for _ in range(3):
        e.step()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(20):
        e.step()
    torch.cuda.synchronize(); ms = 1000 * (time.perf_counter() - t) / 20
    for i in ids:
        e.abort(i)
    while e.has_unfinished():
        e.step()
    out[label] = round(ms, 3)

for ctx in (128, 512, 640, 1024):
    decode_ms(256, ctx, f"contiguous_b256_c{ctx}")
free = list(e.pool._free); random.Random(0).shuffle(free); e.pool._free = collections.deque(free)
for ctx in (128, 512, 640, 1024):
    decode_ms(256, ctx, f"scattered_b256_c{ctx}")
decode_ms(64, 640, "scattered_b64_c640")
print(json.dumps(out))
