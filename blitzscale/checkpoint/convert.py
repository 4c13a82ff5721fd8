"""`blitzscale convert SRC DST`: any source to our per-rank contiguous format.

`--dtype fp8` stores the linear layers in e4m3 with per-output-channel scales (the rest in
bfloat16, the activation dtype a GPU serves them with); the file is the same layout the
worker holds in memory, so a disk load is still one sequential read."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from blitzscale.checkpoint import native
from blitzscale.checkpoint.loader import load_config, load_tokenizer, load_weights, save_tokenizer
from blitzscale.checkpoint.resolve import ModelSource, resolve_model
from blitzscale.core.progress import Report
from blitzscale.errors import CheckpointError
from blitzscale.model.layout import check_tp
from blitzscale.model.quant import check_quant


def default_dtype_of(src: ModelSource) -> torch.dtype:
    """Keep the source's precision: HF folders say theirs, GGUF dequantizes to fp32."""
    if src.kind == "native":
        return native.parse_dtype(native.read_index(src.path)["dtype"])
    if src.kind == "hf":
        d = json.loads((src.path / "config.json").read_text())
        name = d.get("torch_dtype") or d.get("dtype") or "float32"
        return native.parse_dtype(name) if name in ("float32", "bfloat16", "float16") else torch.float32
    return torch.float32


def parse_target(name: str | None) -> tuple[torch.dtype | None, str | None]:
    """`--dtype` -> (activation dtype, quant): None keeps the source's both; "fp8" is FP8
    linears in a bfloat16 model; a float dtype is an unquantized model in it."""
    if name is None:
        return None, None
    if name == "fp8":
        return torch.bfloat16, "fp8"
    return native.parse_dtype(name), "none"


def convert(
    spec: str,
    dst: Path,
    dtype: torch.dtype | None = None,
    tp_size: int = 1,
    quant: str | None = None,
    report: Report | None = None,
) -> Path:
    """`quant`: "none", "fp8", or None for the source's own. `report` hears how far the
    checksums and the writes of each rank's file are, in bytes (core/progress.py)."""
    if tp_size < 1:
        raise CheckpointError(f"--tp must be at least 1, got {tp_size}")
    src = resolve_model(spec)
    if src.kind == "native" and src.path.resolve() == dst.resolve():
        raise CheckpointError(f"source and destination are the same folder: {dst}")
    cfg = load_config(src)
    check_tp(cfg, tp_size)  # (before the weights are read: seconds for a real model)
    if quant is not None:
        cfg = replace(cfg, quant=check_quant(quant))
    dtype = dtype or default_dtype_of(src)
    if src.kind == "native" and tp_size > 1 and cfg.quant != load_config(src).quant:
        raise CheckpointError(
            f"{spec}: changing the quantization of a converted model needs tp=1 (convert from the original)"
        )
    try:
        dst.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # (a file in the way, a folder that cannot be made)
        raise CheckpointError(f"destination {dst}: cannot create the folder: {e.strerror or e}") from None
    for rank in range(tp_size):
        weights = load_weights(src, dtype=dtype, device="cpu", tp_size=tp_size, tp_rank=rank, quant=cfg.quant)
        stage = f"rank {rank + 1} of {tp_size}: " if tp_size > 1 else ""
        native.save_rank(native.rank_file(dst, rank), weights, report, stage)
        del weights
    tokenizer = load_tokenizer(src)
    if tokenizer is not None:
        save_tokenizer(tokenizer, dst)
    native.write_index(dst, cfg, dtype, tp_size)
    return dst
