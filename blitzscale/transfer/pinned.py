"""Page-locked host memory of exactly the size asked for (a model's host copy).

`torch.empty(..., pin_memory=True)` goes through torch's caching host allocator, which
rounds every request up to a power of two: a 16.06 GB host copy of Llama-3-8B pinned 32
GiB, and the first release of each model waited ~11 s for it on an H200's host. Here the
memory is an ordinary allocation of the exact size, registered with CUDA
(`cudaHostRegister`) so copies to and from the GPU run at the pinned rate, and unregistered
when the last tensor over it is gone. It is registered a chunk at a time (see
`pinned_empty`), so copies to and from it go through `copy_pinned`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator

import numpy as np
import torch

# One registration at most: ~8 ms of the driver on an H200's host, the longest a thread
# that serves waits for it (one registration of 16 GB stalled steps for 4-8 s; copies back
# to the device in 16 MB pieces run at the pinned rate: host_copy_stall_h200.py).
CHUNK_BYTES = 16 << 20


def pinned_empty(
    numel: int, dtype: torch.dtype, on_chunk: Callable[[torch.Tensor, int, int], None] | None = None
) -> torch.Tensor:
    """An uninitialized host tensor of `numel` elements, page-locked for CUDA copies.

    Registered a chunk at a time (cut where addresses cross a multiple of `CHUNK_BYTES`),
    and `on_chunk(part, lo, hi)` is called once bytes [lo, hi) are (`part`: those bytes,
    uint8), so a copy into them can start at once. Registering 16 GB in one call held the
    driver for 4-8 s on an H200's host: a model's host copy, made on a thread while another
    model served, stalled that model's steps as long (docs/results/host_copy_stall_h200.py).
    A caller that shares the device with a serving thread pauses in `on_chunk` (the driver
    is not handed over fairly: back to back, 256 MB chunks still stalled steps for 2 s).
    One CUDA copy may not span two registrations: copy through `copy_pinned`."""
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    raw = np.empty(max(1, nbytes), dtype=np.uint8)
    base = raw.ctypes.data
    flat = torch.from_numpy(raw)
    registered: list[int] = []
    try:
        for lo, hi in chunks(base, raw.nbytes):
            err = torch.cuda.cudart().cudaHostRegister(base + lo, hi - lo, 0)
            if int(err) != 0:
                what = f"cudaHostRegister of {hi - lo} bytes at {lo} of {nbytes}"
                raise RuntimeError(f"{what} failed (error {int(err)})")
            registered.append(base + lo)
            if on_chunk is not None:
                on_chunk(flat[lo:hi], lo, hi)
    except BaseException:
        _unregister(registered)
        raise
    # (the array outlives every tensor over it: unregister before its memory is freed)
    weakref.finalize(raw, _unregister, registered)
    return flat[:nbytes].view(dtype)


def chunks(address: int, nbytes: int) -> Iterator[tuple[int, int]]:
    """[lo, hi) byte offsets of the `nbytes` at `address`, cut where the address crosses a
    multiple of `CHUNK_BYTES` (page edges: two registrations never share a page)."""
    lo = 0
    while lo < nbytes:
        hi = min(nbytes, ((address + lo) // CHUNK_BYTES + 1) * CHUNK_BYTES - address)
        yield lo, hi
        lo = hi


def copy_pinned(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> None:
    """`dst.copy_(src)` where one of them may be host memory from `pinned_empty` (1-D,
    contiguous): one copy per registration it spans."""
    if dst.device.type == src.device.type:  # (no host-device copy: nothing to cut)
        dst.copy_(src, non_blocking=non_blocking)
        return
    host = src if src.device.type == "cpu" else dst
    d, s = dst.view(torch.uint8), src.view(torch.uint8)
    for lo, hi in chunks(host.data_ptr(), d.numel()):
        d[lo:hi].copy_(s[lo:hi], non_blocking=non_blocking)


def _unregister(pointers: list[int]) -> None:
    for ptr in pointers:
        torch.cuda.cudart().cudaHostUnregister(ptr)
