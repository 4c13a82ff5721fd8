"""Where a host copy's registrations end (transfer/pinned.py): chunks cut at multiples of
`CHUNK_BYTES` of the address, so every copier finds the same edges, and `copy_pinned`
copies a range piece by piece across them (checked on CPU tensors; the GPU side in
tests/gpu/test_cuda_pinned.py)."""

from __future__ import annotations

import torch

from blitzscale.transfer.pinned import CHUNK_BYTES, chunks, copy_pinned


def test_chunks_end_where_the_address_crosses_a_multiple_of_the_chunk() -> None:
    start = 5 * CHUNK_BYTES - 100  # 100 bytes before an edge
    got = list(chunks(start, 2 * CHUNK_BYTES + 50))
    assert got == [(0, 100), (100, 100 + CHUNK_BYTES), (100 + CHUNK_BYTES, 2 * CHUNK_BYTES + 50)]
    assert list(chunks(3 * CHUNK_BYTES, CHUNK_BYTES)) == [(0, CHUNK_BYTES)]  # (on an edge: one)
    assert list(chunks(7, 10)) == [(0, 10)]
    assert list(chunks(7, 0)) == []


def test_copy_pinned_copies_every_byte_of_any_dtype() -> None:
    src = torch.arange(1000, dtype=torch.float32)
    dst = torch.zeros(1000, dtype=torch.float32)
    copy_pinned(dst, src)  # (host to host: one plain copy)
    assert torch.equal(dst, src)
    bf = torch.zeros(10, dtype=torch.bfloat16)
    copy_pinned(bf, torch.ones(10, dtype=torch.bfloat16))
    assert torch.equal(bf, torch.ones(10, dtype=torch.bfloat16))
