"""Scratch: time a mixed step (running decodes + a few new prompts) on the GPU, warm and cold."""
import json, os, sys, time
import torch
from blitzscale.checkpoint import load_weights, resolve_model
from blitzscale.engine import LLMEngine, SamplingParams
from blitzscale.serve.config import SERVE_ENGINE

w = load_weights(resolve_model("random:llama3-8b"), dtype=torch.bfloat16, device="cuda")
e = LLMEngine(w, None, SERVE_ENGINE.for_device("cuda"))
V = e.model_config.vocab_size
g = torch.Generator().manual_seed(0)
def P(n): return torch.randint(0, V, (n,), generator=g).tolist()
params = SamplingParams(max_tokens=100000, temperature=0, ignore_eos=True)
res = {}
def timed(label, fn, reps=1):
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize(); t = time.perf_counter(); fn(); torch.cuda.synchronize(); ts.append(1000*(time.perf_counter()-t))
    res[label] = [round(x, 2) for x in ts]; print(label, res[label], e.last_work.kind, e.last_work.prompt_tokens, e.last_work.decode_batch, flush=True)

# 60 running requests, decoded a few steps
for _ in range(60): e.add_request(P(512), params)
while e.scheduler.waiting: e.step()
for _ in range(50): e.step()
e._settle()
timed("decode60", e.step, 10)
def mixed(k):
    def f():
        for _ in range(k): e.add_request(P(512), params)
        e.step(); e._settle()
    return f
for k in (1, 4, 8):
    timed(f"mixed60+{k}x512", mixed(k), 5)
    # drop the new ones to keep batch ~60
    for rid in list(e.request_ids())[60:]: e.abort(rid)
    e.step(); e._settle()
# pure prefill of 4 prompts with nothing running
for rid in e.request_ids(): e.abort(rid)
e.step(); e._settle()
def pre(k):
    def f():
        for _ in range(k): e.add_request(P(512), params)
        e.step(); e._settle()
        for rid in e.request_ids(): e.abort(rid)
        e.step(); e._settle()
    return f
timed("prefill4x512_then_abort", pre(4), 5)
# profile one warm mixed step
for _ in range(60): e.add_request(P(512), params)
while e.scheduler.waiting: e.step()
for _ in range(20): e.step()
e._settle()
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    mixed(4)()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25))
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "mixed.json"), "w"), indent=1)
