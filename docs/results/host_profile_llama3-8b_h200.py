"""Scratch measurement (issue 31's cached-prefill target, issue 28's eager mixed steps):
where the host time of an eager step goes on the GPU, by Python function (cProfile) and by
torch op (torch.profiler). Run on the device machine; prints JSON-free text tables."""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import time

import torch

from blitzscale.bench.engine_bench import EngineBenchConfig, _engine, _random_prompts
from blitzscale.checkpoint.loader import load_weights
from blitzscale.checkpoint.resolve import resolve_model
from blitzscale.engine import SamplingParams
from blitzscale.engine.engine import default_dtype

MODEL, DEV = os.environ.get("MODEL", "random:llama3-8b"), os.environ.get("DEV", "cuda")  # (CPU: a smoke run)
dev = torch.device(DEV)
if os.environ.get("THREADS"):  # as a worker process sets its torch threads
    torch.set_num_threads(int(os.environ["THREADS"]))
weights = load_weights(resolve_model(MODEL), dtype=default_dtype(dev), device=dev)
cfg = EngineBenchConfig(model=MODEL, device=DEV, batch_sizes=(64,), context_lens=(512,))
if os.environ.get("ENGINE") == "standby":  # a worker's standby: empty buffer, random stand-in values
    from blitzscale.checkpoint.loader import load_config
    from blitzscale.engine import LLMEngine
    from blitzscale.model.weights import ModelWeights
    from blitzscale.serve.config import SERVE_ENGINE
    from blitzscale.worker.costprobe import fill_random

    del weights
    weights = ModelWeights.empty(load_config(resolve_model(MODEL)), default_dtype(dev), dev)
    fill_random(weights, seed=0)
    weights.readiness.mark_all_ready()
    engine = LLMEngine(weights, None, SERVE_ENGINE.for_device(dev.type))
elif os.environ.get("ENGINE") == "serve":  # the engine serve's workers build on this device
    from blitzscale.engine import LLMEngine
    from blitzscale.serve.config import SERVE_ENGINE

    engine = LLMEngine(weights, None, SERVE_ENGINE.for_device(dev.type))
else:  # bench engine's
    engine = _engine(weights, cfg, 64)
print("engine", os.environ.get("ENGINE", "bench"), engine.config)
vocab = weights.config.vocab_size
params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)


def sync() -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def cached_pair(seed: int) -> tuple[list[int], list[int]]:
    a, b = _random_prompts(2, 2048, vocab, seed)
    b[:1536] = a[:1536]
    return a, b


def timed(fn) -> float:
    sync()
    t = time.perf_counter()
    fn()
    sync()
    return 1000 * (time.perf_counter() - t)


for s in range(3):  # warm
    a, b = cached_pair(100 + s)
    engine.generate([a], params)
    engine.generate([b], params)
fresh512 = _random_prompts(8, 512, vocab, 5)
print("fresh 512 ms", [round(timed(lambda p=p: engine.generate([p], params)), 2) for p in fresh512[:4]])
times = []
for s in range(4):
    a, b = cached_pair(200 + s)
    engine.generate([a], params)
    times.append(round(timed(lambda b=b: engine.generate([b], params)), 2))
print("cached 1536 + 512 ms", times)

# host-only: the forward of a cached-prefix prompt with the GPU far behind (launch cost)
a, b = cached_pair(300)
engine.generate([a], params)
prof = cProfile.Profile()
sync()
prof.enable()
engine.generate([b], params)
prof.disable()
sync()
for key in () if os.environ.get("BRIEF") else ("tottime", "cumulative"):
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats(key).print_stats(28)
    print(out.getvalue()[-6000:])

if os.environ.get("BRIEF"):
    raise SystemExit(0)
a, b = cached_pair(400)
engine.generate([a], params)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as p:
    engine.generate([b], params)
    sync()
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
print(p.key_averages().table(sort_by="self_device_time_total", row_limit=15))
