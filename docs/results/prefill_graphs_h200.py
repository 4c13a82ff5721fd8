"""One-prompt steps with and without their CUDA graphs (engine/prefill_graphs.py), on the
device: a fresh prompt of each length to its first token, and a 2048-token prompt whose
first 1536 tokens are cached, each the best of REPS, in one process and on one engine (the
engine serve's workers build on this device). Prints JSON.

    python3 docs/results/prefill_graphs_h200.py > docs/results/prefill_graphs_h200.json
"""

from __future__ import annotations

import json
import os
import time

import torch

from blitzscale.bench.engine_bench import _random_prompts
from blitzscale.checkpoint.loader import load_weights
from blitzscale.checkpoint.resolve import resolve_model
from blitzscale.engine import LLMEngine, SamplingParams
from blitzscale.engine.engine import default_dtype
from blitzscale.serve.config import SERVE_ENGINE

MODEL = os.environ.get("MODEL", "random:llama3-8b")
LENGTHS = (16, 64, 128, 256, 384, 512, 768, 1024, 2048)
REPS = 5
dev = torch.device("cuda")
weights = load_weights(resolve_model(MODEL), dtype=default_dtype(dev), device=dev)
engine = LLMEngine(weights, None, SERVE_ENGINE.for_device("cuda"))
vocab = weights.config.vocab_size
params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
graphs = engine.runner.prefill_graphs


def timed(prompt: list[int], cached: list[int] | None = None) -> float:
    engine.reset_prefix_cache()
    if cached is not None:
        engine.generate([cached], params)
    torch.cuda.synchronize()
    t = time.perf_counter()
    engine.generate([prompt], params)
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - t)


def best(make) -> float:
    return round(min(timed(*make(rep)) for rep in range(REPS)), 3)


def fresh(n: int):
    return lambda rep: (_random_prompts(1, n, vocab, 100 + rep)[0],)


def cached_pair(rep: int) -> tuple[list[int], list[int]]:
    a, b = _random_prompts(2, 2048, vocab, 200 + rep)
    b[:1536] = a[:1536]
    return b, a


timed(*fresh(512)(0))  # (warm: the allocator, cuBLAS)
out: dict = {"model": MODEL, "device": torch.cuda.get_device_name(), "reps": REPS}
out["buckets"] = graphs.buckets if graphs else []
out["capture_s"] = {k: round(v, 3) for k, v in engine.runner.capture_s.items()}
out["engine"] = {"max_num_batched_tokens": engine.config.max_num_batched_tokens}
rows = {}
for mode in ("graphs", "eager"):
    engine.runner.prefill_graphs = graphs if mode == "graphs" else None
    rows[mode] = {str(n): best(fresh(n)) for n in LENGTHS}
    rows[mode]["cached_1536_of_2048"] = best(cached_pair)
engine.runner.prefill_graphs = graphs
out["first_token_ms"] = rows
g, e = rows["graphs"], rows["eager"]
out["cached_ratio"] = {"graphs": round(g["cached_1536_of_2048"] / g["2048"], 3)}
out["cached_ratio"]["eager"] = round(e["cached_1536_of_2048"] / e["2048"], 3)
print(json.dumps(out, indent=1))
