"""Loading weights on a worker from local sources (disk in our format, HF folders, random)."""

from __future__ import annotations

import time

import torch

from blitzscale.checkpoint import load_weights, resolve_model
from blitzscale.messages import LoadResult
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
) -> tuple[ModelWeights, LoadResult]:
    """Weights on `device`, and how they came (path, bytes, seconds)."""
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
        )
        return weights, stats
    t = time.perf_counter()
    weights = load_weights(src, dtype=dtype, device=device, tp_size=tp_size, tp_rank=tp_rank)
    path = "random" if src.kind == "random" else "disk"
    return weights, LoadResult(path=path, bytes=weights.layout.nbytes, seconds=time.perf_counter() - t)
