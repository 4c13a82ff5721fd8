"""`blitzscale convert SRC DST`: any source to our per-rank contiguous format."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from blitzscale.checkpoint import native
from blitzscale.checkpoint.loader import load_config, load_tokenizer, load_weights
from blitzscale.checkpoint.resolve import ModelSource, resolve_model
from blitzscale.errors import CheckpointError


def default_dtype_of(src: ModelSource) -> torch.dtype:
    """Keep the source's precision: HF folders say theirs, GGUF dequantizes to fp32."""
    if src.kind == "native":
        return native.parse_dtype(native.read_index(src.path)["dtype"])
    if src.kind == "hf":
        d = json.loads((src.path / "config.json").read_text())
        name = d.get("torch_dtype") or d.get("dtype") or "float32"
        return native.parse_dtype(name) if name in ("float32", "bfloat16", "float16") else torch.float32
    return torch.float32


def convert(spec: str, dst: Path, dtype: torch.dtype | None = None, tp_size: int = 1) -> Path:
    if tp_size < 1:
        raise CheckpointError(f"--tp must be at least 1, got {tp_size}")
    src = resolve_model(spec)
    if src.kind == "native" and src.path.resolve() == dst.resolve():
        raise CheckpointError(f"source and destination are the same folder: {dst}")
    cfg = load_config(src)
    dtype = dtype or default_dtype_of(src)
    dst.mkdir(parents=True, exist_ok=True)
    for rank in range(tp_size):
        weights = load_weights(src, dtype=dtype, device="cpu", tp_size=tp_size, tp_rank=rank)
        native.save_rank(native.rank_file(dst, rank), weights)
        del weights
    tokenizer = load_tokenizer(src)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(dst))
    native.write_index(dst, cfg, dtype, tp_size)
    return dst
