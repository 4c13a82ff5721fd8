"""FP8 GEMMs with fast accumulation (`torch._scaled_mm(..., use_fast_accum=True)`) against
the default, on one GPU (issue 32, session 32).

Why: an FP8 prefill of Llama-3-8B takes 0.70-0.80x bf16's time where its linears alone take
0.58-0.62x (docs/results/fp8_prefill_paths.py): the FP8 GEMMs reach well under twice
bf16's rate. By default Hopper's FP8 GEMMs promote their partial sums to fp32 every few K
steps; fast accumulation does not (vLLM's CUTLASS FP8 kernels run so).

1. Each linear of Llama-3-8B at 64, 512, 2,048 and 4,096 rows (eight copies cycled in a
   CUDA graph): bf16 `F.linear`, rowwise `_scaled_mm` without and with fast accumulation,
   and the unit-scale GEMM (decode steps of 2-64 rows) without and with it.
2. Their error at 2,048 rows against the fp32 product of the same quantized operands: the
   largest difference over the largest reference value, and the smallest row cosine.
3. The engine's 2,048-token prefill (bench engine's timing), bf16 / FP8 / FP8 with
   `linear.PREFILL_FAST_ACCUM`, three rounds interleaved, and the FP8 engines' logits
   against the bf16 engine's on the same weights dequantized.

Run (GPU machine, repo root): `OUT=. python3 docs/results/fp8_fast_accum.py`; writes
$OUT/fp8_fast_accum.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "docs" / "results"))
import fp8_decode_candidates as cand  # noqa: E402

from blitzscale.bench import engine_bench as eb  # noqa: E402
from blitzscale.kvcache.cache import KVCache  # noqa: E402
from blitzscale.model import linear as lin  # noqa: E402
from blitzscale.model.attention import AttentionMetadata  # noqa: E402
from blitzscale.model.triton_ops import quantize_tokens  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp"))
SWEEP = cand.SweepLog()
res, log = SWEEP.res, SWEEP.log
one = torch.ones((), device="cuda")


def rowwise(xq: tuple, w: tuple, fast: bool) -> torch.Tensor:  # type: ignore[type-arg]
    q, sc = w
    return torch._scaled_mm(
        xq[0], q.t(), scale_a=xq[1], scale_b=sc.view(1, -1), out_dtype=torch.bfloat16, use_fast_accum=fast
    )


def unit(xq: tuple, w: tuple, fast: bool) -> torch.Tensor:  # type: ignore[type-arg]
    return torch._scaled_mm(
        xq[0], w[0].t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=fast
    )


def linears(m: int, w8: dict, w16: dict) -> dict:
    x = {s: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for s, (n, k) in cand.SHAPES.items()}
    xq = {s: quantize_tokens(x[s]) for s in cand.SHAPES}
    out = {"bf16": cand.layer_ms(lambda s, i: F.linear(x[s], w16[s][i]))}
    for fast in (False, True):
        tag = "_fast" if fast else ""
        out[f"rowwise{tag}"] = cand.layer_ms(lambda s, i, f=fast: rowwise(xq[s], w8[s][i], f))
        out[f"unit{tag}"] = cand.layer_ms(lambda s, i, f=fast: unit(xq[s], w8[s][i], f))
    return out


def errors(m: int, w8: dict) -> dict:
    out: dict = {}
    for s, (_, k) in cand.SHAPES.items():
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        xq = quantize_tokens(x)
        q, sc = w8[s][0]
        ref = (xq[0].float() * xq[1]) @ (q.float() * sc[:, None]).t()
        for fast in (False, True):
            got = rowwise(xq, (q, sc), fast).float()
            cos = F.cosine_similarity(got, ref, dim=-1)
            out[f"{s}{'_fast' if fast else ''}"] = {
                "max_err_over_max": round(float((got - ref).abs().max() / ref.abs().max()), 6),
                "min_row_cosine": round(float(cos.min()), 7),
            }
    return out


# 1-2. the linears alone, and their error
weights8, weights16 = cand.sweep_weights()
res["linears"] = {}
for rows in (64, 512, 2048, 4096):
    res["linears"][rows] = linears(rows, weights8, weights16)
    log(rows=rows, **{k: v["layer"] for k, v in res["linears"][rows].items()})
res["errors_2048"] = errors(2048, weights8)
log(errors_2048=res["errors_2048"])
del weights8, weights16
torch.cuda.empty_cache()

# 3. the engine's prefill and logits
cfg = eb.EngineBenchConfig(batch_sizes=(1,), context_lens=(512,), with_hf=False, dtype="fp8")
dev = torch.device("cuda")
fp8, dense = eb.fp8_and_dequantized(cfg.model, dev, torch.bfloat16)
fast_of = {"bf16": False, "fp8": False, "fp8_fast": True}
engines = {}
for name, fast in fast_of.items():  # (the mixed-step graphs are captured as the flag is)
    lin.PREFILL_FAST_ACCUM = fast
    engines[name] = eb._engine(dense if name == "bf16" else fp8, cfg, 1)
times: dict[str, list[float]] = {k: [] for k in engines}
for _ in range(3):
    for name, engine in engines.items():
        lin.PREFILL_FAST_ACCUM = fast_of[name]
        times[name].append(round(eb._prefill_ms(engine, cfg, dev), 3))
    log(prefill_ms=times)
res["prefill_2048_ms"] = times
res["prefill_over_bf16"] = {k: round(min(v) / min(times["bf16"]), 3) for k, v in times.items() if k != "bf16"}
log(prefill_over_bf16=res["prefill_over_bf16"])


@torch.inference_mode()
def prompt_logits(name: str, n: int = 512) -> torch.Tensor:
    """Logits of a random n-token prompt (more rows than W8A8_MAX_ROWS: the rowwise GEMM)."""
    engine = engines[name]
    lin.PREFILL_FAST_ACCUM = fast_of[name]
    kv = KVCache(engine.model_config, 1, n, engine.kv_cache.data.dtype, dev)
    meta = AttentionMetadata.build([n], [n], [[0]], n, dev)
    ids = torch.tensor(eb._random_prompts(1, n, engine.model_config.vocab_size, 7)[0], device=dev)
    return engine.model.forward(ids, meta, kv).float()


ref = prompt_logits("bf16")
res["logits_vs_bf16"] = {name: eb._logit_stats(prompt_logits(name), ref) for name in ("fp8", "fp8_fast")}
lin.PREFILL_FAST_ACCUM = False
log(logits_vs_bf16=res["logits_vs_bf16"])
(OUT / "fp8_fast_accum.json").write_text(json.dumps(res, indent=1))
