"""Helpers of a worker's serving plane: point-to-point tensor moves (KV migrations,
relays), waited on by helper threads so the serving loop never blocks on the wire, and
the conversion of messages' sampling parameters."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from blitzscale.worker.dispatch import short_error, to_params

__all__ = ["Move", "finished", "short_error", "to_params", "wait_all", "wait_one"]
MIGRATION_TIMEOUT_S = 30.0


@dataclass
class Move:
    done: Future[None]  # completes when the p2p op has (gloo reports nothing until waited on)
    buf: torch.Tensor
    hidden: torch.Tensor | None = None  # a relay: the hidden states that come with the KV
    aborted: bool = False  # the request was aborted while its data was on the wire


def finished(moves: dict[str, Move], orphans: list[Move]) -> Iterator[tuple[str, Move, BaseException | None]]:
    """Take the completed moves out of `moves`: (request id, move, error or None). A failed
    move's buffers go to `orphans`: a receive may still land in them, so they must live."""
    for rid, m in list(moves.items()):
        if not m.done.done():
            continue
        del moves[rid]
        err = m.done.exception()
        if err is not None:
            orphans.append(m)
        yield rid, m, err


def wait_all(works: list[dist.Work], device: torch.device) -> None:
    for w in works:
        wait_one(w, device)


def wait_one(work: dist.Work, device: torch.device) -> None:
    work.wait(timeout=timedelta(seconds=MIGRATION_TIMEOUT_S))
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
