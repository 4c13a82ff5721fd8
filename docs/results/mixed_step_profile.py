"""A mixed step (a 512-token prompt joining 32 rows decoding at context 2,048: the point
`blitzscale profile` takes for `mixed_extra_ms`) timed and profiled, bf16 beside FP8 on the
same weights (session 28: the FP8 profile's mixed_extra_ms came out 40.8 ms on an H200,
11.7 in session 24). Prints per dtype the decode step alone, the mixed step, the GPU's
kernel time in a mixed step, and the host's top ops. (`mixed_step_profile_llama3-8b_h200.py`
of session 13 profiles the same step for bf16 alone at several batch sizes and prints tables;
this one sets FP8 beside bf16 and writes JSON.)

The JSON beside it (`mixed_step_profile_h100.json`, session 28; the call asked for an H200
and came on an H100) came from a first form that summed `key_averages()`'s device times for
`mixed_gpu_kernels_ms`: that counts a torch op that launches a kernel (aten::mm,
aten::_scaled_mm, flash attention) once for the op and once for its kernel. This form sums
the kernels alone.

Run (GPU machine, repo root): `OUT=. python3 docs/results/mixed_step_profile.py`; writes
$OUT/mixed_step_profile.json.
"""

from __future__ import annotations

import json
import os
import random
import sys
from dataclasses import replace
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from blitzscale.bench import engine_bench as eb  # noqa: E402
from blitzscale.bench.engine_bench import EngineBenchConfig  # noqa: E402
from blitzscale.checkpoint import load_weights, resolve_model  # noqa: E402
from blitzscale.checkpoint.pack import hf_state_dict, pack_into  # noqa: E402
from blitzscale.engine import SamplingParams  # noqa: E402
from blitzscale.model.weights import ModelWeights  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp"))
BATCH, CONTEXT, PROMPT, STEPS = 32, 2048, 512, 8


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    """ms of fn(), the GPU synchronized before and after (bench engine's own timer)."""
    return 1000 * eb._timed(fn, torch.device("cuda"))


def measure(weights: ModelWeights) -> dict:
    cfg = EngineBenchConfig(batch_sizes=(BATCH,), context_lens=(CONTEXT,), prefill_len=PROMPT)
    engine = eb._engine(weights, cfg, BATCH + 64)
    vocab = weights.config.vocab_size
    rng = random.Random(0)

    def prompt(n: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(n)]

    long = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)
    one = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    ids = [engine.add_request(prompt(CONTEXT), long) for _ in range(BATCH)]
    while any(engine.request(i).num_output_tokens == 0 for i in ids):  # type: ignore[union-attr]
        engine.step()
    for _ in range(3):
        engine.step()
    decode = min(timed(engine.step) for _ in range(STEPS))

    def mixed() -> None:
        engine.add_request(prompt(PROMPT), one)
        engine.step()

    for _ in range(3):
        mixed()  # warm: any compilation of the mixed shapes
    mixed_ms = sorted(timed(mixed) for _ in range(STEPS))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            mixed()
        torch.cuda.synchronize()
    avg = prof.key_averages()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    cuda_us = sum(e.time_range.end - e.time_range.start for e in kernels) / 3
    top_cpu = sorted(avg, key=lambda e: -e.self_cpu_time_total)[:15]
    top_gpu = sorted(avg, key=lambda e: -e.self_device_time_total)[:10]
    out = {
        "decode_ms": round(decode, 3),
        "mixed_ms_min_median": [round(mixed_ms[0], 3), round(mixed_ms[len(mixed_ms) // 2], 3)],
        "mixed_gpu_kernels_ms": round(cuda_us / 1000, 3),
        "top_cpu_self_ms": {e.key[:70]: round(e.self_cpu_time_total / 3000, 3) for e in top_cpu},
        "top_cpu_calls": {e.key[:70]: e.count // 3 for e in top_cpu},
        "top_gpu_ms": {e.key[:70]: round(e.self_device_time_total / 3000, 3) for e in top_gpu},
    }
    for rid in engine.request_ids():
        engine.abort(rid)
    while engine.has_unfinished():
        engine.step()
    return out


def main() -> None:
    device = torch.device("cuda")
    fp8 = load_weights(resolve_model("random:llama3-8b"), dtype=torch.bfloat16, device=device, quant="fp8")
    dense = ModelWeights.empty(replace(fp8.config, quant="none"), torch.bfloat16, device)
    pack_into(dense, hf_state_dict(fp8).__getitem__)
    res: dict = {"device": torch.cuda.get_device_name()}
    for label, w in (("bf16", dense), ("fp8", fp8)):
        res[label] = measure(w)
        eb._free(device)
        print(json.dumps({label: res[label]}), flush=True)
    (OUT / "mixed_step_profile.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
