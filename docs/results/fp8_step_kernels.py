"""Where a decode step's GPU time goes, kernel by kernel, FP8 beside bf16 (issue 32,
session 28): the step's CUDA graph (the engine's own, as `bench engine` builds it) replayed
under torch's profiler; each kernel's time summed by kind, and the graph's span against
the kernels' sum (what is left is the gaps between kernels: launch and ramp, which no
kernel's speed removes).

With `prefill` (session 31): a 2,048-token prefill to its first token instead, twice each,
wall time beside the kernels' sum and span ($OUT/fp8_prefill_kernels_<gpu>.json).

Run (GPU machine, repo root): `OUT=. python3 docs/results/fp8_step_kernels.py [prefill]`; writes
$OUT/fp8_step_kernels_<gpu>.json (h100 or h200, by the card it ran on; session 28's call
asked for an H200 and came on an H100: `fp8_step_kernels_h100.json`).
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from blitzscale.bench import engine_bench as eb  # noqa: E402
from blitzscale.bench.engine_bench import EngineBenchConfig  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp"))
KINDS = (  # first match wins
    ("gemv", "fp8 gemv"),
    ("scale_out", "scale pass"),
    ("rms_norm", "norm (FP8: quantizing too)"),
    ("silu", "silu (FP8: quantizing too)"),
    ("quantize", "quantize alone"),
    ("rotary", "rotary (and KV write)"),
    ("store_kv", "KV write"),
    ("attn", "attention"),
    ("attention", "attention"),
    ("decode", "attention"),
    ("gemm", "gemm (cuBLAS)"),
    ("nvjet", "gemm (cuBLAS)"),
    ("sm90", "gemm (cuBLAS)"),
    ("cutlass", "gemm (cuBLAS)"),
)


def kind(name: str) -> str:
    low = name.lower()
    return next((k for s, k in KINDS if s in low), "other")


def graph_kernels(engine, batch: int, cfg: EngineBenchConfig, device: torch.device) -> dict:  # type: ignore[no-untyped-def]
    eb._decode_ms(engine, cfg, batch, cfg.context_lens[0], device, 4, [])
    graphs = engine.runner.graphs
    g = graphs.graphs[graphs.bucket_for(batch)]
    reps = 5
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            g.replay()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    timed = 1000 * eb._timed(lambda: [g.replay() for _ in range(10)], device) / 10
    return {"graph_ms": round(timed, 3), **summarize(events, reps)}


def summarize(events: list, reps: int) -> dict:  # type: ignore[type-arg]
    """CUDA kernel events of `reps` repetitions: their sum by kind, the span from the first
    kernel's start to the last one's end, and the gaps (span less the sum), per repetition."""
    events.sort(key=lambda e: e.time_range.start)
    by_kind: dict[str, float] = defaultdict(float)
    names: dict[str, float] = defaultdict(float)
    for e in events:
        us = e.time_range.end - e.time_range.start
        by_kind[kind(e.name)] += us / reps
        names[e.name[:80]] += us / reps
    span = (events[-1].time_range.end - events[0].time_range.start) / reps if events else 0.0
    busy = sum(by_kind.values())
    return {
        "kernels": len(events) // reps,
        "kernel_sum_ms": round(busy / 1000, 3),
        "span_ms": round(span / 1000, 3),
        "gaps_ms": round((span - busy) / 1000, 3),
        "by_kind_ms": {k: round(v / 1000, 4) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "top_kernels_ms": {
            k: round(v / 1000, 4) for k, v in sorted(names.items(), key=lambda kv: -kv[1])[:12]
        },
    }


def prefill_kernels(engine, cfg: EngineBenchConfig, device: torch.device) -> dict:  # type: ignore[no-untyped-def]
    """One prompt of cfg.prefill_len to its first token (as `bench engine` times it), under
    the profiler: the wall time, and the kernels' sum and span (session 31: FP8's 2,048-token
    prefill is 0.70-0.80x bf16's where its linears alone are 0.59x)."""
    from blitzscale.engine import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    vocab = engine.model_config.vocab_size
    warm, prompt = eb._random_prompts(2, cfg.prefill_len, vocab, 11)
    engine.reset_prefix_cache()
    engine.generate([warm], params)
    wall = 1000 * eb._timed(lambda: engine.generate([prompt], params), device)
    engine.reset_prefix_cache()
    engine.generate([warm], params)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine.generate([prompt], params)
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return {"wall_ms": round(wall, 3), **summarize(events, 1)}


def main_prefill() -> None:
    device = torch.device("cuda")
    cfg = EngineBenchConfig(model="random:llama3-8b", device="cuda", batch_sizes=(1,), context_lens=(512,))
    fp8, dense = eb.fp8_and_dequantized(cfg.model, device, torch.bfloat16)
    res: dict = {"device": torch.cuda.get_device_name(), "prefill_len": cfg.prefill_len}
    engines = {"bf16": eb._engine(dense, cfg, 1), "fp8": eb._engine(fp8, cfg, 1)}
    for rep in range(2):
        for label, engine in engines.items():
            res[f"{label}_{rep}"] = prefill_kernels(engine, cfg, device)
            print(json.dumps({f"{label}_{rep}": res[f"{label}_{rep}"]}), flush=True)
    card = "h100" if "H100" in res["device"] else "h200"
    (OUT / f"fp8_prefill_kernels_{card}.json").write_text(json.dumps(res, indent=1))


def main() -> None:
    if sys.argv[1:] == ["prefill"]:
        main_prefill()
        return
    device = torch.device("cuda")
    cfg = EngineBenchConfig(model="random:llama3-8b", device="cuda", batch_sizes=(1, 64), context_lens=(512,))
    fp8, dense = eb.fp8_and_dequantized(cfg.model, device, torch.bfloat16)
    res: dict = {"device": torch.cuda.get_device_name(), "context": cfg.context_lens[0]}
    for label, w in (("bf16", dense), ("fp8", fp8)):
        engine = eb._engine(w, cfg, 64)
        res[label] = {str(b): graph_kernels(engine, b, cfg, device) for b in cfg.batch_sizes}
        print(json.dumps({label: res[label]}), flush=True)
        del engine
        eb._free(device)
    card = "h100" if "H100" in res["device"] else "h200"
    (OUT / f"fp8_step_kernels_{card}.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
