"""Raw limits measured in the same run as a benchmark: what the hardware can do at best."""

from __future__ import annotations

import json
import mmap
import os
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

from blitzscale.cluster.local import free_port
from blitzscale.transfer.disk import drop_page_cache


def pinned_h2d_GBps(nbytes: int = 4 << 30, device: str = "cuda:0", reps: int = 3) -> float:
    """The best host-to-device rate from page-locked memory of exactly `nbytes` (the kind a
    host copy lives in: transfer/pinned.py; torch's pin_memory would pin twice as much)."""
    from blitzscale.transfer.pinned import copy_pinned, pinned_empty

    host = pinned_empty(nbytes, torch.uint8)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    copy_pinned(dev, host)
    torch.cuda.synchronize(device)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        copy_pinned(dev, host, non_blocking=True)
        torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


def graph_replay_ms(fn: Callable[[], object], reps: int = 20, tries: int = 5) -> float:
    """Milliseconds of one call of `fn` (CUDA work), replayed `reps` times from one CUDA
    graph (no launch overhead, as inside a decode step's graph); the best of `tries`."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(tries):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) / reps)
    return best


def _sendrecv_worker(rank: int, port: int, nbytes: int, reps: int, out: str) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    buf = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{rank}")
    best = float("inf")
    for _ in range(reps + 1):
        dist.barrier()
        torch.cuda.synchronize()
        t = time.perf_counter()
        if rank == 0:
            dist.send(buf, dst=1)
        else:
            dist.recv(buf, src=0)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    if rank == 1:
        Path(out).write_text(json.dumps({"GBps": nbytes / best / 1e9}))
    dist.destroy_process_group()


def nccl_sendrecv_GBps(nbytes: int = 4 << 30, reps: int = 3) -> float:
    """GPU 0 -> GPU 1 with one NCCL send/recv of `nbytes` (best of `reps`)."""
    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d) / "result.json")
        tmp.spawn(_sendrecv_worker, args=(free_port("127.0.0.1"), nbytes, reps, out), nprocs=2)
        return float(json.loads(Path(out).read_text())["GBps"])


def raw_read_GBps(path: Path, readers: int, cold: bool, direct: bool = True, chunk: int = 64 << 20) -> float:
    """Read the whole file with `readers` threads; cold drops the page cache first and reads
    with O_DIRECT unless `direct` is False."""
    if cold:
        drop_page_cache(path)
    size = path.stat().st_size
    flags = os.O_RDONLY | (os.O_DIRECT if cold and direct and hasattr(os, "O_DIRECT") else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        fd = os.open(path, os.O_RDONLY)
    bufs = [mmap.mmap(-1, chunk) for _ in range(readers)]  # page-aligned, as O_DIRECT needs

    def read(i: int) -> int:
        view = memoryview(bufs[i % readers])
        done = 0
        for off in range(i * chunk, size, readers * chunk):
            done += os.preadv(fd, [view[: min(chunk, size - off)]], off)
        return done

    t = time.perf_counter()
    with ThreadPoolExecutor(readers) as pool:
        total = sum(pool.map(read, range(readers)))
    seconds = time.perf_counter() - t
    os.close(fd)
    return total / seconds / 1e9
