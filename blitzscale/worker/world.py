"""A worker's links to the others: one pair of process groups per peer, rebuilt when a
peer is replaced.

A world-sized process group cannot take a new member, so a worker that died could never be
replaced. Instead every pair of workers has two groups of size two of its own (weights,
and KV: a migration never interleaves with a weight transfer on one communicator), built
from the controller's rendezvous store under a key that names both members' incarnations.
When a worker is respawned only the links that touch it are rebuilt; the others keep
serving and transferring as they were. On NCCL this is what lazy initialisation gave each
pair anyway: a communicator and stream of its own, so a relay can receive from its
predecessor while sending to its successor.

Creating a communicator costs ~100 ms on NCCL; paying it at scale time would eat the whole
budget, so every link exchanges one message as soon as it is built.

With tensor-parallel instances (`tp` > 1) the ranks [k*tp, (k+1)*tp) also share an instance
group, built at cluster start with the links (never at scale time): `compute` for the
model's all-reduces (NCCL on GPU, gloo on CPU) and `control`, always gloo, on which the
instance's leader tells its other shards what to run (worker/tp.py). The control group
waits without a deadline (an idle instance says nothing for hours) and fails at once when a
member dies (a closed connection). A group that lost a member is rebuilt, among the new
incarnations, once every member is alive again (`connect_instance`, on InstanceLinkMsg).
"""

from __future__ import annotations

import fcntl
import itertools
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from blitzscale.errors import BlitzScaleError

PLANES = ("weights", "kv")
CONTROL_TIMEOUT = timedelta(days=3650)  # an instance group's control plane: no deadline


class NoLinkError(BlitzScaleError):
    """There is no live link to that rank (it died and has not been replaced yet)."""


@dataclass(frozen=True)
class InstanceGroup:
    """The process groups of one tensor-parallel rank group, as one of its members sees them."""

    members: tuple[int, ...]  # global ranks; members[k] holds shard k
    rank: int  # this worker's index in `members` (its shard)
    compute: dist.ProcessGroup  # the model's all-reduces
    control: dist.ProcessGroup  # the leader's commands (gloo)
    key: str  # names every member's incarnation: a rebuilt group has a new one

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def leader(self) -> int:
        return self.members[0]


@dataclass(frozen=True)
class _Pair:
    groups: dict[str, dist.ProcessGroup]
    peer_index: int  # the peer's rank inside the pair's groups (0 or 1)


class Links:
    def __init__(
        self,
        rank: int,
        incarnation: int,
        addr: str,
        port: int,
        device: torch.device,
        timeout_s: float,
        tp: int = 1,
    ) -> None:
        # The store is served by the controller, bound to `addr` only (cluster/local.py);
        # gloo's own listeners go on the interface that carries `addr` (by default gloo binds
        # to the address the machine's hostname resolves to, reachable from other hosts).
        iface = interface_of(addr)
        if iface is not None:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", iface)
            os.environ.setdefault("NCCL_SOCKET_IFNAME", iface)  # NCCL bootstrap
        self.rank = rank
        self.incarnation = incarnation
        self.device = device
        self.timeout = timedelta(seconds=timeout_s)
        self._addr, self._port = addr, port
        self._pairs: dict[int, _Pair] = {}
        self._lock = threading.Lock()  # links are rebuilt on a helper thread
        self.tp = tp
        self.instance: InstanceGroup | None = None  # this rank's tensor-parallel group (tp > 1)

    # --- building ------------------------------------------------------------------------

    def connect_world(self, world_size: int) -> float:
        """At cluster start (every member in its first incarnation): a link to every other
        rank, pairs in one global order (deadlock-free: the first unbuilt pair always has
        both members waiting on it). Returns the seconds it took."""
        t = time.perf_counter()
        for a, b in itertools.combinations(range(world_size), 2):
            if self.rank in (a, b):
                self.connect(b if self.rank == a else a, 0)
        if self.tp > 1:  # after every pair: each rank is in one group, so no order is needed
            self.connect_instance({r: 0 for r in self.instance_members()})
        return time.perf_counter() - t

    def instance_members(self) -> tuple[int, ...]:
        first = self.rank - self.rank % self.tp
        return tuple(range(first, first + self.tp))

    def connect_instance(self, incarnations: dict[int, int]) -> float:
        """Build (or rebuild) this rank's instance group among these incarnations of its
        members; returns when an all-reduce went round on both of its process groups."""
        t = time.perf_counter()
        members = self.instance_members()
        if sorted(incarnations) != list(members):
            raise ValueError(
                f"rank {self.rank}'s instance group is {list(members)}, got {sorted(incarnations)}"
            )
        key = "instance/" + "-".join(f"{r}.{incarnations[r]}" for r in members)
        me = members.index(self.rank)
        store = dist.TCPStore(self._addr, self._port, is_master=False, timeout=self.timeout)
        compute = self._group(dist.PrefixStore(f"{key}/compute", store), me, len(members))
        control = dist.ProcessGroupGloo(
            dist.PrefixStore(f"{key}/control", store), me, len(members), CONTROL_TIMEOUT
        )
        for g, device in ((compute, self.device), (control, torch.device("cpu"))):
            token = torch.ones(1, device=device)
            g.allreduce([token]).wait(self.timeout)
            if int(token.item()) != len(members):
                raise BlitzScaleError(f"instance group {key}: the first all-reduce gave {token.item()}")
        with self._lock:
            self.instance = InstanceGroup(members, me, compute, control, key)
        return time.perf_counter() - t

    def connect_peers(self, peers: dict[int, int]) -> float:
        """A replacement: a link to every live peer (rank -> its incarnation), in rank order;
        each peer builds its side when the controller tells it to."""
        t = time.perf_counter()
        for peer in sorted(peers):
            self.connect(peer, peers[peer])
        return time.perf_counter() - t

    def connect(
        self, peer: int, peer_incarnation: int, generation: int = 0, planes: tuple[str, ...] = PLANES
    ) -> None:
        """Build (or rebuild) the link to `peer`; returns when one message went both ways.
        `planes`: only these planes of a link that exists (the others keep serving), under
        a `generation` both ends were given: a plane broken by a failed transfer
        (`break_plane`) is rebuilt between the same incarnations under a new key."""
        if peer == self.rank:
            raise ValueError(f"rank {self.rank} cannot link to itself")
        if not planes or not set(planes) <= set(PLANES):
            raise ValueError(f"planes must be among {PLANES}, got {planes}")
        ends = sorted([(self.rank, self.incarnation), (peer, peer_incarnation)])
        key = "link/" + "-".join(f"{r}.{i}" for r, i in ends) + (f"/g{generation}" if generation else "")
        me = 0 if ends[0][0] == self.rank else 1
        # A store client of its own: a client waits for a key holding its lock, so a link
        # whose peer never comes must not hold up the next one.
        store = dist.TCPStore(self._addr, self._port, is_master=False, timeout=self.timeout)
        groups = {plane: self._group(dist.PrefixStore(f"{key}/{plane}", store), me) for plane in planes}
        token = torch.zeros(1, device=self.device)
        for g in groups.values():  # the lower rank speaks first
            first, second = (g.send, g.recv) if me == 0 else (g.recv, g.send)
            first([token], 1 - me, 0).wait(self.timeout)
            second([token], 1 - me, 0).wait(self.timeout)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        with self._lock:
            old = self._pairs.get(peer)
            if old is not None and planes != PLANES:
                groups = {**old.groups, **groups}
            self._pairs[peer] = _Pair(groups, 1 - me)

    def break_plane(self, peer: int, plane: str) -> None:
        """Destroy this end of the link to `peer` on `plane`, after a transfer on it failed:
        whatever the peer still waits for on it fails at once (gloo: the connection closes;
        NCCL: the communicator is aborted), and no receive left posted by the failed
        transfer can take a later transfer's data. Until `connect` rebuilds it (the
        controller asks both ends), using it raises NoLinkError. The caller must hold no
        pending op of that group: a gloo op still referenced keeps its connection open."""
        with self._lock:
            pair = self._pairs.get(peer)
            group = pair.groups.pop(plane, None) if pair is not None else None
        if group is not None and self.device.type == "cuda":
            abort = getattr(group, "abort", None)
            if abort is not None:
                abort()
        del group  # gloo: the last reference; its connection closes here

    def _group(self, store: dist.Store, me: int, size: int = 2) -> dist.ProcessGroup:
        if self.device.type == "cuda":
            return dist.ProcessGroupNCCL(store, me, size, _nccl_options(self.timeout))
        return dist.ProcessGroupGloo(store, me, size, self.timeout)

    def close(self) -> None:
        """At exit: NCCL wants its communicators shut down before the process ends."""
        with self._lock:
            pairs, self._pairs = list(self._pairs.values()), {}
            instance, self.instance = self.instance, None
        groups = [g for pair in pairs for g in pair.groups.values()]
        for g in groups + ([instance.compute] if instance is not None else []):
            shutdown = getattr(g, "shutdown", None)
            if shutdown is not None and self.device.type == "cuda":
                shutdown()

    def drop(self, peer: int) -> None:
        """Forget the link to a dead peer (on NCCL its communicators are aborted: work toward
        a process that is gone would never finish)."""
        with self._lock:
            pair = self._pairs.pop(peer, None)
        if pair is not None and self.device.type == "cuda":
            for g in pair.groups.values():
                abort = getattr(g, "abort", None)
                if abort is not None:
                    abort()

    @property
    def peers(self) -> list[int]:
        with self._lock:
            return sorted(self._pairs)

    # --- moving tensors ------------------------------------------------------------------

    def isend(self, t: torch.Tensor, dst: int, plane: str) -> dist.Work:
        group, peer = self._link(dst, plane)
        return group.send([t], peer, 0)

    def irecv(self, t: torch.Tensor, src: int, plane: str) -> dist.Work:
        group, peer = self._link(src, plane)
        return group.recv([t], peer, 0)

    def _link(self, rank: int, plane: str) -> tuple[dist.ProcessGroup, int]:
        with self._lock:
            pair = self._pairs.get(rank)
        if pair is None:
            raise NoLinkError(f"rank {self.rank} has no link to rank {rank}")
        group = pair.groups.get(plane)
        if group is None:
            raise NoLinkError(
                f"rank {self.rank}'s {plane} link to rank {rank} broke with a failed transfer "
                "and is not rebuilt yet"
            )
        return group, pair.peer_index


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


def _nccl_options(timeout: timedelta) -> object:
    """High-priority streams for NCCL: weights and KV keep moving while the engine's kernels
    fill the GPU (a source serves while it sends)."""
    opts = dist.ProcessGroupNCCL.Options()
    opts.is_high_priority_stream = True
    opts._timeout = timeout
    return opts


class SlotLinks:
    """A serving loop's view of the links when a worker serves several models: the router
    names a peer instance by its slot's rank (rank + slot * world_size), its tensors move
    between the workers' ranks. Everything else is the links' own."""

    def __init__(self, links: Links, world_size: int) -> None:
        self._links = links
        self._world_size = world_size

    def isend(self, t: torch.Tensor, dst: int, plane: str) -> dist.Work:
        return self._links.isend(t, dst % self._world_size, plane)

    def irecv(self, t: torch.Tensor, src: int, plane: str) -> dist.Work:
        return self._links.irecv(t, src % self._world_size, plane)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._links, name)
