"""Loading our on-disk format onto a device: parallel reads, overlapped host-to-device copies.

The rank file is the buffer byte for byte, so the load is cut into fixed chunks read by a
pool of readers (with O_DIRECT where the filesystem and buffer alignment allow), each into
a pinned staging slot that is copied to the GPU while later chunks are being read. A
segment's readiness is bumped once all its chunks are on the device.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from blitzscale.checkpoint import native
from blitzscale.checkpoint.pack import copy_weights
from blitzscale.errors import CheckpointError
from blitzscale.messages import LoadResult
from blitzscale.model.weights import ModelWeights

CHUNK_BYTES = 64 << 20
_PAGE = 4096


class Pacer:
    """Sleeps so that bytes pass at no more than `bytes_per_s` (0: no limit)."""

    def __init__(self, bytes_per_s: float) -> None:
        self.rate = bytes_per_s
        self.start = time.perf_counter()
        self.done = 0

    def __call__(self, nbytes: int) -> None:
        if self.rate <= 0:
            return
        self.done += nbytes
        delay = self.start + self.done / self.rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)


def drop_page_cache(path: Path) -> None:
    """Ask the kernel to forget the file's cached pages (a cold read next time)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _open(path: Path, direct: bool) -> tuple[int, bool]:
    if direct and hasattr(os, "O_DIRECT"):
        try:
            return os.open(path, os.O_RDONLY | os.O_DIRECT), True
        except OSError:
            pass
    return os.open(path, os.O_RDONLY), False


def _chunks(weights: ModelWeights, chunk_bytes: int) -> list[tuple[int, int, int]]:
    """(segment, byte offset in the buffer, bytes) in file order."""
    out = []
    item = weights.layout.itemsize
    for si, seg in enumerate(weights.layout.segments):
        start, end = seg.offset * item, (seg.offset + seg.numel) * item
        for off in range(start, end, chunk_bytes):
            out.append((si, off, min(chunk_bytes, end - off)))
    return out


def _read_into(fd: int, dest: torch.Tensor, file_offset: int) -> None:
    view = memoryview(dest.numpy())
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], file_offset + done)
        if n <= 0:
            raise CheckpointError(f"short read at offset {file_offset + done}")
        done += n


def load_native(
    folder: Path,
    rank: int,
    device: torch.device | str,
    dtype: torch.dtype | None = None,
    readers: int = 8,
    chunk_bytes: int = CHUNK_BYTES,
    direct: bool = False,
    max_bytes_per_s: float = 0.0,
    into: ModelWeights | None = None,
) -> tuple[ModelWeights, LoadResult]:
    """`max_bytes_per_s` caps the read rate (0: none), to reproduce a slower disk. `into`:
    a buffer of the file's shape and stored dtype on `device` to read into (a worker's
    standby), instead of a new one."""
    path = native.rank_file(folder, rank)
    device = torch.device(device)
    header, weights = native.open_rank(path, device, into)
    # each segment lands once here; a reused buffer (`into`) may still expect a striped
    # transfer's several pieces per segment, and would never count as all ready
    weights.readiness.reset()
    weights.readiness.set_expected(1)
    t0 = time.perf_counter()
    chunks = _chunks(weights, chunk_bytes)
    last_of_segment = {si: i for i, (si, _, _) in enumerate(chunks)}
    if device.type == "cuda":
        slots = [torch.empty(chunk_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(2 * readers)]
        aligned = all(s.data_ptr() % _PAGE == 0 for s in slots)
    else:
        slots, aligned = [], weights.buffer.data_ptr() % _PAGE == 0
    pace = Pacer(max_bytes_per_s)
    fd, used_direct = _open(path, direct and aligned)
    try:
        with ThreadPoolExecutor(max_workers=readers) as pool:
            if slots:
                _load_via_pinned(
                    fd, header["data_offset"], weights, chunks, last_of_segment, pool, slots, pace
                )
            else:
                _load_direct(fd, header["data_offset"], weights, chunks, last_of_segment, pool, pace)
    finally:
        os.close(fd)
    first_layer_at = weights.readiness.first_ready_at(1)
    seconds = time.perf_counter() - t0
    stats = LoadResult(
        path="disk",
        bytes=weights.layout.nbytes,
        seconds=seconds,
        GBps=weights.layout.nbytes / seconds / 1e9,
        first_layer_s=(first_layer_at - t0) if first_layer_at else seconds,
        direct_io=used_direct,
        readers=readers,
    )
    if dtype is not None and dtype != weights.dtype:
        lay = weights.layout
        cast = ModelWeights.empty(weights.config, dtype, device, lay.tp_size, lay.tp_rank)
        copy_weights(weights, cast)
        weights = cast
    return weights, stats


def _load_direct(
    fd: int,
    data_offset: int,
    weights: ModelWeights,
    chunks: list[tuple[int, int, int]],
    last_of_segment: dict[int, int],
    pool: ThreadPoolExecutor,
    pace: Pacer,
) -> None:
    """CPU target: read straight into the weight buffer."""
    raw = weights.buffer.view(torch.uint8)
    futures = [pool.submit(_read_into, fd, raw[off : off + n], data_offset + off) for _, off, n in chunks]
    for i, (si, _, n) in enumerate(chunks):
        futures[i].result()
        pace(n)
        if last_of_segment[si] == i:
            weights.readiness.add(si)


def _load_via_pinned(
    fd: int,
    data_offset: int,
    weights: ModelWeights,
    chunks: list[tuple[int, int, int]],
    last_of_segment: dict[int, int],
    pool: ThreadPoolExecutor,
    slots: list[torch.Tensor],
    pace: Pacer,
) -> None:
    """GPU target: readers fill pinned slots; the copy stream drains them in file order."""
    num_slots = len(slots)
    raw = weights.buffer.view(torch.uint8)
    stream = torch.cuda.Stream(weights.device)
    done_events: list[torch.cuda.Event | None] = [None] * num_slots
    futures: dict[int, Future[None]] = {}

    def submit(i: int) -> None:
        _, off, n = chunks[i]
        slot = i % num_slots
        if done_events[slot] is not None:
            done_events[slot].synchronize()  # the slot's previous copy has left it
        futures[i] = pool.submit(_read_into, fd, slots[slot][:n], data_offset + off)

    for i in range(min(num_slots, len(chunks))):
        submit(i)
    for i, (si, off, n) in enumerate(chunks):
        futures.pop(i).result()
        pace(n)
        slot = i % num_slots
        with torch.cuda.stream(stream):
            raw[off : off + n].copy_(slots[slot][:n], non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(stream)
        done_events[slot] = ev
        if last_of_segment[si] == i:
            ev.synchronize()
            weights.readiness.add(si)
        if i + num_slots < len(chunks):
            submit(i + num_slots)
    stream.synchronize()
