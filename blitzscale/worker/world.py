"""Joining the worker world and warming up every point-to-point connection at start.

Creating a communicator costs ~100 ms on NCCL; paying it at scale time would eat the whole
budget, so every pair exchanges one message at cluster start.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import socket
import struct
from datetime import timedelta

import torch
import torch.distributed as dist


def init_world(
    rank: int, world_size: int, addr: str, port: int, device: torch.device, timeout_s: float
) -> None:
    # No device_id: eager NCCL init would put every point-to-point op on the one default
    # communicator and serialize them; lazily, each pair gets its own communicator and
    # stream, so a relay can receive from its predecessor while sending to its successor.
    # The store is served by the controller, bound to `addr` only (cluster/local.py); gloo's
    # own listeners go on the interface that carries `addr` (by default gloo binds to the
    # address the machine's hostname resolves to, reachable from other hosts).
    backend = "nccl" if device.type == "cuda" else "gloo"
    iface = interface_of(addr)
    if iface is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", iface)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", iface)  # NCCL bootstrap
    store = dist.TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=timeout_s))
    dist.init_process_group(
        backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
        pg_options=_nccl_options(device),
    )


def interface_of(addr: str) -> str | None:
    """The name of the network interface whose IPv4 address is `addr` (Linux), or None."""
    try:
        want = socket.inet_aton(socket.gethostbyname(addr))
    except OSError:
        return None
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _index, name in socket.if_nameindex():
            try:
                req = struct.pack("256s", name.encode()[:15])
                got = fcntl.ioctl(s.fileno(), siocgifaddr, req)[20:24]
            except OSError:  # no IPv4 address on it
                continue
            if got == want:
                return name
    return None


def _nccl_options(device: torch.device) -> object | None:
    """High-priority streams for NCCL: weights and KV keep moving while the engine's kernels
    fill the GPU (a source serves while it sends)."""
    if device.type != "cuda":
        return None
    opts = dist.ProcessGroupNCCL.Options()
    opts.is_high_priority_stream = True
    return opts


def new_world_group(device: torch.device) -> dist.ProcessGroup:
    """A second group over all ranks with communicators of its own (KV migration uses it,
    so it never interleaves with weight transfers on one pair's communicator)."""
    return dist.new_group(
        backend="nccl" if device.type == "cuda" else "gloo", pg_options=_nccl_options(device)
    )


def warm_up_pairs(
    rank: int, world_size: int, device: torch.device, group: dist.ProcessGroup | None = None
) -> int:
    """Exchange one message with every other rank, pairs in one global order (deadlock-free:
    the first unfinished pair always has both members waiting on it). Returns pairs touched."""
    token = torch.zeros(1, device=device)
    touched = 0
    for a, b in itertools.combinations(range(world_size), 2):
        if rank == a:
            dist.send(token, dst=b, group=group)
            dist.recv(token, src=b, group=group)
        elif rank == b:
            dist.recv(token, src=a, group=group)
            dist.send(token, dst=a, group=group)
        else:
            continue
        touched += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return touched
