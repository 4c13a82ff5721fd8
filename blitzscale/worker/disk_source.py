"""Loading weights on a worker from local sources (disk in our format, HF folders, random)."""

from __future__ import annotations

import time

import torch

from blitzscale.checkpoint import load_weights, resolve_model
from blitzscale.checkpoint.native import stored_shape
from blitzscale.messages import LoadResult
from blitzscale.model.config import ModelConfig
from blitzscale.model.weights import ModelWeights
from blitzscale.transfer.disk import load_native


def load_local(
    spec: str,
    dtype: torch.dtype,
    device: torch.device,
    tp_size: int,
    tp_rank: int,
    readers: int,
    direct_io: bool = False,
    max_bytes_per_s: float = 0.0,
    into: ModelWeights | None = None,
) -> tuple[ModelWeights, LoadResult]:
    """Weights on `device`, and how they came (path, bytes, seconds); read into `into` (a
    buffer `fits_into` said yes to) instead of a new buffer."""
    src = resolve_model(spec)
    if src.kind == "native":
        weights, stats = load_native(
            src.path,
            tp_rank,
            device,
            dtype=dtype,
            readers=readers,
            direct=direct_io,
            max_bytes_per_s=max_bytes_per_s,
            into=into,
        )
        return weights, stats
    assert into is None, "only a model in our format loads into a given buffer"
    t = time.perf_counter()
    weights = load_weights(src, dtype=dtype, device=device, tp_size=tp_size, tp_rank=tp_rank)
    path = "random" if src.kind == "random" else "disk"
    return weights, LoadResult(path=path, bytes=weights.layout.nbytes, seconds=time.perf_counter() - t)


def disk_shape(spec: str, tp_rank: int, dtype: torch.dtype) -> ModelConfig | None:
    """The configuration of `spec` if it loads from disk as it is stored, in `dtype` (a
    model in our format whose rank file holds that dtype): such a load can fill an existing
    buffer of that shape. None otherwise."""
    src = resolve_model(spec)
    if src.kind != "native":
        return None
    config, stored = stored_shape(src.path, tp_rank)
    return config if stored == dtype else None
