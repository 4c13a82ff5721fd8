"""Page-locked host memory of exactly the size asked for (a model's host copy).

`torch.empty(..., pin_memory=True)` goes through torch's caching host allocator, which
rounds every request up to a power of two: a 16.06 GB host copy of Llama-3-8B pinned 32
GiB, and the first release of each model waited ~11 s for it on an H200's host. Here the
memory is an ordinary allocation of the exact size, registered with CUDA
(`cudaHostRegister`) so copies to and from the GPU run at the pinned rate, and unregistered
when the last tensor over it is gone.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch


def pinned_empty(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized host tensor of `numel` elements, page-locked for CUDA copies."""
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    raw = np.empty(max(1, nbytes), dtype=np.uint8)
    ptr = raw.ctypes.data
    err = torch.cuda.cudart().cudaHostRegister(ptr, raw.nbytes, 0)
    if int(err) != 0:
        raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed (error {int(err)})")
    # (the array outlives every tensor over it: unregister before its memory is freed)
    weakref.finalize(raw, _unregister, ptr)
    return torch.from_numpy(raw)[:nbytes].view(dtype)


def _unregister(ptr: int) -> None:
    torch.cuda.cudart().cudaHostUnregister(ptr)
