"""Scratch measurement (issue 28: the simulator's cost of a mixed step): a step with 512
prompt tokens and B decode rows, against a 512-token prefill alone and the B rows alone,
on serve's engine configuration; wall time per step (synchronised, overlap off) and the
device time by kernel (torch.profiler). Run on the device machine; prints text."""

from __future__ import annotations

import os
import time
from dataclasses import replace

import torch

from blitzscale.bench.engine_bench import _random_prompts
from blitzscale.checkpoint.loader import load_weights
from blitzscale.checkpoint.resolve import resolve_model
from blitzscale.engine import LLMEngine, SamplingParams
from blitzscale.engine.engine import default_dtype
from blitzscale.serve.config import SERVE_ENGINE

MODEL = os.environ.get("MODEL", "random:llama3-8b")
dev = torch.device(os.environ.get("DEV", "cuda"))
weights = load_weights(resolve_model(MODEL), dtype=default_dtype(dev), device=dev)
cfg = replace(SERVE_ENGINE.for_device(dev.type), overlap="off")
engine = LLMEngine(weights, None, cfg)
vocab = weights.config.vocab_size
one = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
long = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)
seed = iter(range(1000, 100000))
acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if dev.type == "cuda" else [])
BATCHES = (8, 32, 128) if dev.type == "cuda" else (2,)


def sync() -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed_step() -> float:
    sync()
    t = time.perf_counter()
    engine.step()
    sync()
    return 1000 * (time.perf_counter() - t)


def decoding(batch: int, ctx: int) -> list[str]:
    ids = [engine.add_request(p, long) for p in _random_prompts(batch, ctx, vocab, next(seed))]
    while any((r := engine.request(i)) is not None and r.num_output_tokens < 2 for i in ids):
        engine.step()
    return ids


def done(ids: list[str]) -> None:
    for i in ids:
        engine.abort(i)
    while engine.has_unfinished():
        engine.step()


engine.generate(_random_prompts(2, 512, vocab, 1), one)  # warm
for _ in range(3):
    engine.add_request(_random_prompts(1, 512, vocab, next(seed))[0], one)
    print("prefill 512 alone ms", round(timed_step(), 2))
    done([])
for batch in BATCHES:
    ids = decoding(batch, 600 if dev.type == "cuda" else 100)
    dec = [round(timed_step(), 2) for _ in range(3)]
    mixed = []
    for _ in range(3):
        engine.add_request(_random_prompts(1, 512, vocab, next(seed))[0], one)
        mixed.append(round(timed_step(), 2))
        engine.step()
    print(f"batch {batch} ctx 600: decode ms {dec}, mixed 512 + {batch} rows ms {mixed}")
    if batch == BATCHES[len(BATCHES) // 2]:
        engine.add_request(_random_prompts(1, 512, vocab, next(seed))[0], one)
        with torch.profiler.profile(activities=acts) as p:
            engine.step()
            sync()
        print(p.key_averages().table(sort_by="self_device_time_total" if dev.type == "cuda" else "self_cpu_time_total", row_limit=18))
    done(ids)
engine.add_request(_random_prompts(1, 512, vocab, next(seed))[0], one)
with torch.profiler.profile(activities=acts) as p:
    engine.step()
    sync()
print("== prefill 512 alone")
print(p.key_averages().table(sort_by="self_device_time_total" if dev.type == "cuda" else "self_cpu_time_total", row_limit=12))
