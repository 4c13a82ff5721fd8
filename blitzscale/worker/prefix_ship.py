"""Hot prefixes travel with the weights: a serving worker's side.

When the scaler brings a model onto a new instance from one that serves it, the source's
most reused cached prefix blocks follow the weights over the KV link, and the new
instance's first requests that share those prefixes skip computing them. Three commands,
each answered once (the controller runs them, cluster/local.py `ship_prefixes`):
- `PrefixExportMsg` (source): name the hot blocks and pack a copy of their KV now; answered
  at once with the blocks (none if there are none);
- `PrefixRecvMsg` (target): reserve empty blocks and post the receive; answered at once
  (a target without room refuses, and nothing is sent); when the blocks land they are
  registered as cached, if the receive fails they go back;
- `PrefixSendMsg` (source): send the export's copy; answered when it has gone.
A source keeps one export at a time (the controller ships from a rank one target after
another); a newer export, or the engine going, drops it.
Engines of one rank only: a tensor-parallel instance's KV is spread over its shards. On a
GPU the packed copy (source) and the receive buffer (target) take device memory beside the
KV cache: at most half of what is free, so shipping never costs a step an out-of-memory.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torch.distributed import Work

from blitzscale.engine import LLMEngine
from blitzscale.errors import BlitzScaleError
from blitzscale.messages import (
    PrefixBlock,
    PrefixExportMsg,
    PrefixExportResult,
    PrefixMoveResult,
    PrefixRecvMsg,
    PrefixSendMsg,
    ReplyResult,
)
from blitzscale.worker.p2p import Move, finished, wait_one
from blitzscale.worker.world import Links

log = logging.getLogger("blitzscale.worker")
Reply = Callable[[int, bool, ReplyResult, str], None]  # (op id, ok, result, error)
COPY_SHARE_OF_FREE = 0.5  # of the device's free memory, for a packed copy or a receive buffer


def copy_room(engine: LLMEngine) -> int | None:
    """How many blocks a packed copy may hold on the engine's device (None: no bound, as
    on CPU, where it is host memory)."""
    device = engine.handoffs.kv_cache.data.device
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(COPY_SHARE_OF_FREE * free) // engine.handoffs.block_bytes


@dataclass
class _Pending:
    op_id: int
    started: float
    count: int  # blocks on the wire
    block_ids: list[int]  # a receive's reserved blocks (a send's: none)
    blocks: list[PrefixBlock]  # a receive's


class PrefixShipping:
    """Composed into the serving loop; the worker gives it the engine serving the model
    a command names (None: it serves no such model, or tensor-parallel)."""

    def __init__(self, rank: int, links: Links, waiters: ThreadPoolExecutor, reply: Reply) -> None:
        self.rank = rank
        self.links = links
        self.waiters = waiters
        self.reply = reply
        self._export: tuple[int, torch.Tensor, int] | None = None  # (id, KV copy, blocks)
        self._moves: dict[str, Move] = {}
        self._pending: dict[str, _Pending] = {}
        self.orphans: list[Move] = []  # failed receives' buffers (the data may still land)

    @property
    def busy(self) -> bool:
        return bool(self._moves)

    def export(self, engine: LLMEngine | None, msg: PrefixExportMsg) -> PrefixExportResult:
        self._export = None
        if engine is None:
            return PrefixExportResult(export_id=msg.op_id)  # nothing to give
        room = copy_room(engine)
        hot = engine.handoffs.hot_prefixes(msg.max_blocks if room is None else min(msg.max_blocks, room))
        if not hot:
            return PrefixExportResult(export_id=msg.op_id)
        buf = engine.handoffs.blocks_out([h.block for h in hot])
        self._export = (msg.op_id, buf, len(hot))
        blocks = [PrefixBlock(h.hash, h.parent, h.hits) for h in hot]
        return PrefixExportResult(export_id=msg.op_id, blocks=blocks, bytes=_nbytes(buf))

    def holds(self, export_id: int) -> bool:
        return self._export is not None and self._export[0] == export_id

    def send(self, msg: PrefixSendMsg) -> None:
        """Answered when sent (`poll`)."""
        if self._export is None or self._export[0] != msg.export_id:
            raise BlitzScaleError(f"rank {self.rank} has no prefix export {msg.export_id}")
        _, buf, n = self._export
        self._export = None
        work = self.links.isend(buf, msg.dst_rank, "kv")
        self._start(f"send{msg.op_id}", work, buf, _Pending(msg.op_id, time.perf_counter(), n, [], []))

    def recv(self, engine: LLMEngine | None, msg: PrefixRecvMsg) -> PrefixMoveResult:
        """The receive is posted: its blocks and bytes (`poll` registers them on arrival)."""
        if engine is None:
            raise BlitzScaleError(f"rank {self.rank} serves no engine of one rank for {msg.model}")
        room = copy_room(engine)
        if room is not None and len(msg.blocks) > room:
            raise BlitzScaleError(
                f"rank {self.rank}: no device memory to receive {len(msg.blocks)} prefix blocks ({room} fit)"
            )
        ids = engine.handoffs.reserve_prefixes(len(msg.blocks))
        buf = engine.handoffs.kv_buffer(len(ids))
        try:
            work = self.links.irecv(buf, msg.src_rank, "kv")
        except (RuntimeError, BlitzScaleError):  # the sender is gone
            engine.handoffs.cancel_prefixes(ids)
            raise
        pending = _Pending(msg.op_id, time.perf_counter(), len(ids), ids, list(msg.blocks))
        self._start(f"recv{msg.op_id}", work, buf, pending)
        return PrefixMoveResult(blocks=len(ids), bytes=_nbytes(buf), seconds=0.0)

    def _start(self, key: str, work: Work, buf: torch.Tensor, pending: _Pending) -> None:
        self._moves[key] = Move(self.waiters.submit(wait_one, work, buf.device), buf)
        self._pending[key] = pending

    def poll(self, engine: LLMEngine | None) -> None:
        """Moves that ended: a landed receive's blocks become cached (a failed one's go
        back); a send is answered."""
        for key, move, err in finished(self._moves, self.orphans):
            p = self._pending.pop(key)
            seconds = time.perf_counter() - p.started
            if p.block_ids:
                if engine is None:  # (dropped meanwhile: its pool went with it)
                    continue
                if err is not None:
                    log.warning("rank %d: hot prefix blocks did not arrive (%s)", self.rank, err)
                    engine.handoffs.cancel_prefixes(p.block_ids)
                    continue
                engine.handoffs.blocks_in(p.block_ids, move.buf)
                n = engine.handoffs.commit_prefixes(
                    p.block_ids, [(b.hash, b.parent, b.hits) for b in p.blocks]
                )
                log.info(
                    "rank %d: %d hot prefix blocks arrived in %.3f s (%d new)", self.rank, p.count, seconds, n
                )
                continue
            result = PrefixMoveResult(
                blocks=p.count if err is None else 0, bytes=_nbytes(move.buf), seconds=seconds
            )
            self.reply(p.op_id, err is None, result, "" if err is None else f"{type(err).__name__}: {err}")

    def drop(self) -> None:
        """The engine is going: an export is of no use any more."""
        self._export = None


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
