"""Attention over the paged KV cache: the metadata, the backend seam and its backends.

`select_backend` picks by device and dtype: the Triton kernels for bf16/fp16 on CUDA (imported
only then: the CPU path never imports Triton), else the SDPA reference.
"""

from __future__ import annotations

import torch

from blitzscale.model.attention.base import AttentionBackend
from blitzscale.model.attention.metadata import AttentionMetadata
from blitzscale.model.attention.reference import ReferenceBackend


def uses_triton(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cuda" and dtype in (torch.bfloat16, torch.float16)


def select_backend(device: torch.device, dtype: torch.dtype, name: str = "auto") -> AttentionBackend:
    if name == "reference" or (name == "auto" and not uses_triton(device, dtype)):
        return ReferenceBackend()
    from blitzscale.model.attention.triton_backend import TritonBackend

    return TritonBackend()


__all__ = ["AttentionBackend", "AttentionMetadata", "ReferenceBackend", "select_backend", "uses_triton"]
