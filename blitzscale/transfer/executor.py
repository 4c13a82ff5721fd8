"""Runs one rank's part of a transfer plan over torch.distributed point-to-point ops.

Every participant walks the same piece list in the same order, so each pair of ranks sees
its messages in one agreed order (NCCL and gloo keep per-pair FIFO order). Receives are
posted up front; a piece is forwarded as soon as it has landed, and each landing bumps the
receiver's readiness counter for its segment. Every wait is bounded: a dead peer turns
into a TransferError on every survivor instead of a hang, and a rank whose part fails
breaks its weights links to its neighbours in the plan, so they fail at once too.
"""

from __future__ import annotations

import contextlib
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist

from blitzscale.errors import BlitzScaleError
from blitzscale.messages import TransferMsg, TransferRankResult
from blitzscale.model.layout import WeightLayout
from blitzscale.model.readiness import SegmentReadiness
from blitzscale.transfer.pinned import copy_pinned
from blitzscale.transfer.plan import Piece, make_pieces, pieces_per_segment, role_of


class TransferError(BlitzScaleError):
    """A transfer could not complete (a peer died or timed out)."""


class Links(Protocol):
    """Point-to-point ops to other ranks by their cluster rank (worker/world.py); weights
    move on the "weights" plane."""

    def isend(self, t: torch.Tensor, dst: int, plane: str) -> dist.Work: ...

    def irecv(self, t: torch.Tensor, src: int, plane: str) -> dist.Work: ...

    def break_plane(self, peer: int, plane: str) -> None: ...


@dataclass
class TransferStats:
    start: float  # wall clock, seconds
    bytes_received: int = 0
    bytes_sent: int = 0
    first_layer_at: float | None = None
    done_at: float | None = None
    is_target: bool = False
    ready_order: list[int] = field(default_factory=list)  # segments, in the order they became ready

    def as_result(self, received_at: float) -> TransferRankResult:
        """The reply's result; `received_at`: when the command reached the rank."""
        return TransferRankResult(
            start=self.start,
            received_at=received_at,
            done_at=self.done_at if self.done_at is not None else time.time(),
            first_layer_at=self.first_layer_at,
            bytes_received=self.bytes_received,
            bytes_sent=self.bytes_sent,
            is_target=self.is_target,
            ready_order=list(self.ready_order),
        )


_MAX_STAGED = 4


@dataclass
class _Channel:
    """Point-to-point ops with deadlines; on CUDA, completion is observed through events."""

    links: Links
    device: torch.device
    timeout_s: float
    max_bytes_per_s: float
    sends: list[tuple[dist.Work, int, torch.Tensor]] = field(default_factory=list)
    _paced_bytes: int = 0
    _paced_start: float = 0.0

    def __post_init__(self) -> None:
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def _posting(self) -> contextlib.AbstractContextManager[object]:
        """Post ops from the channel's own stream: NCCL orders an op after the caller's
        current stream, and the default stream carries the engine's kernels, so a source
        that serves while it sends would otherwise hold its sends back behind its own work."""
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def irecv(self, t: torch.Tensor, src: int) -> dist.Work:
        try:
            with self._posting():
                return self.links.irecv(t, src, "weights")
        except (RuntimeError, BlitzScaleError) as e:  # gloo: the peer is gone; or no link
            raise TransferError(f"receive from rank {src}: {str(e).splitlines()[0]}") from e

    def isend(self, t: torch.Tensor, dst: int) -> None:
        if self.max_bytes_per_s > 0:
            if not self._paced_start:
                self._paced_start = time.monotonic()
            self._paced_bytes += t.numel() * t.element_size()
            delay = self._paced_start + self._paced_bytes / self.max_bytes_per_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        try:
            with self._posting():
                self.sends.append((self.links.isend(t, dst, "weights"), dst, t))
        except (RuntimeError, BlitzScaleError) as e:  # gloo: the peer is gone; or no link
            raise TransferError(f"send to rank {dst}: {str(e).splitlines()[0]}") from e

    def wait(self, work: dist.Work, what: str) -> None:
        try:
            if self.stream is None:
                work.wait(timeout=timedelta(seconds=self.timeout_s))
                return
            with torch.cuda.stream(self.stream):
                work.wait()
                event = torch.cuda.Event()
                event.record(self.stream)
            deadline = time.monotonic() + self.timeout_s
            while not event.query():
                if time.monotonic() > deadline:
                    raise TransferError(f"{what}: no progress in {self.timeout_s:.1f} s")
                time.sleep(20e-6)
        except TransferError:
            raise
        except RuntimeError as e:  # gloo: peer closed, timeout
            raise TransferError(f"{what}: {str(e).splitlines()[0]}") from e

    def stage(self, host_piece: torch.Tensor) -> torch.Tensor:
        """A host piece made sendable: NCCL cannot read host memory, so bounce it through
        a few device buffers (at most `_MAX_STAGED` in flight)."""
        if self.stream is None:
            return host_piece
        while len(self.sends) >= _MAX_STAGED:
            work, dst, _ = self.sends.pop(0)
            self.wait(work, f"send to rank {dst}")
        with self._posting():  # the send that follows is posted on the same stream
            staged = torch.empty_like(host_piece, device=self.device)
            copy_pinned(staged, host_piece, non_blocking=True)
            return staged

    def wait_sends(self) -> None:
        for work, dst, _ in self.sends:
            self.wait(work, f"send to rank {dst}")
        self.sends.clear()


def run_transfer(
    rank: int,
    links: Links,
    msg: TransferMsg,
    layout: WeightLayout,
    device: torch.device,
    buffer: torch.Tensor | None,
    readiness: SegmentReadiness | None,
    host_buffer: torch.Tensor | None = None,
) -> TransferStats:
    """Do this rank's part. `buffer` is the device copy (sent from, or received into)."""
    pieces = make_pieces(layout, msg.num_stripes, msg.piece_bytes)
    role = role_of(rank, msg.chains)
    heads = {j for j, c in enumerate(msg.chains) if c[0] == rank}
    loads_from_host = msg.host_source and msg.head_is_target and bool(heads)
    stats = TransferStats(start=time.time(), is_target=role.is_target or loads_from_host)
    if stats.is_target:
        assert buffer is not None and readiness is not None
        readiness.reset()
        readiness.set_expected(pieces_per_segment(pieces, len(layout.segments)))
    if msg.host_source and heads and host_buffer is None:
        raise TransferError(f"rank {rank} holds no host copy of {msg.model}")
    chan = _Channel(links, device, msg.timeout_s, msg.max_bytes_per_s)
    recvs: dict[int, dist.Work] = {}
    from_host = msg.host_source and not loads_from_host
    # Only sending, from weights still arriving here (the last target of a chain in flight,
    # which this load joined): each piece leaves once its segment has landed.
    forwarding = not stats.is_target and readiness is not None and not readiness.all_ready
    try:
        for i, p in enumerate(pieces):
            if p.stripe in role.recv_from:
                recvs[i] = chan.irecv(_view(buffer, p), role.recv_from[p.stripe])
        for i, p in enumerate(pieces):
            if p.stripe in role.recv_from:
                chan.wait(recvs.pop(i), f"piece {i} from rank {role.recv_from[p.stripe]}")
                _landed(stats, readiness, p, layout)
            elif loads_from_host and p.stripe in heads:
                copy_pinned(_view(buffer, p), _view(host_buffer, p))
                _landed(stats, readiness, p, layout)
            if p.stripe in role.send_to:
                if from_host and p.stripe in heads:
                    src = chan.stage(_view(host_buffer, p))
                else:
                    if forwarding:
                        assert readiness is not None
                        _await_landed(readiness, p.segment, msg.timeout_s)
                    src = _view(buffer, p)
                chan.isend(src, role.send_to[p.stripe])
                stats.bytes_sent += p.numel * layout.itemsize
        chan.wait_sends()
    except BaseException as e:
        if stats.is_target and readiness is not None:  # a load forwarding from here stops too
            readiness.fail(f"{type(e).__name__}: {e}")
        # Break this rank's weights links to its neighbours in the plan: a neighbour still
        # waiting on this rank fails now instead of at its timeout (and so on down the
        # chain), and no receive left posted here can take a later transfer's data. The
        # controller rebuilds the links between the survivors. The ops are let go first
        # (gloo keeps a connection open while an op on it is referenced).
        recvs.clear()
        chan.sends.clear()
        traceback.clear_frames(sys.exc_info()[2])  # (the failed wait's frame holds its op)
        if device.type == "cuda":  # an aborted NCCL kernel may not have left the buffer yet
            _ORPHANED.append(buffer)
        break_neighbours(rank, links, msg)
        raise
    stats.done_at = time.time()
    return stats


_ORPHANED: list[torch.Tensor | None] = []


def break_neighbours(rank: int, links: Links, msg: TransferMsg) -> None:
    """Break this rank's weights links to its neighbours in `msg`'s plan, after its part
    failed or could not start: whoever waits on it there fails now, not at the timeout."""
    role = role_of(rank, msg.chains)
    for peer in {*role.recv_from.values(), *role.send_to.values()}:
        links.break_plane(peer, "weights")


def _view(buf: torch.Tensor | None, p: Piece) -> torch.Tensor:
    assert buf is not None
    return buf[p.offset : p.offset + p.numel]


def _await_landed(readiness: SegmentReadiness, segment: int, timeout_s: float) -> None:
    if not readiness.wait(segment, timeout_s):
        why = readiness.failed or f"nothing landed in {timeout_s:.1f} s"
        raise TransferError(f"segment {segment} never landed here to be forwarded: {why}")


def _landed(stats: TransferStats, readiness: SegmentReadiness | None, p: Piece, layout: WeightLayout) -> None:
    assert readiness is not None
    readiness.add(p.segment)
    if readiness.is_ready(p.segment):
        stats.ready_order.append(p.segment)
    stats.bytes_received += p.numel * layout.itemsize
    if stats.first_layer_at is None and readiness.num_ready_prefix >= 2:
        stats.first_layer_at = time.time()  # embedding and layer 0 are usable
