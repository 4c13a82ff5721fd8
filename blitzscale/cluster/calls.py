"""Commands to workers and their replies: every command names an op id, and its worker
answers it once (`ReplyMsg`). `Calls` sends a set of commands through the controller's
mailbox and waits for every reply, or its stand-in: a rank that dies answers "worker
died", one that says nothing by the deadline "no reply in time". Nothing here raises for a
failed reply except `each_ok`; the operations decide what a failure means.
"""

from __future__ import annotations

import asyncio
import time
from asyncio import FIRST_COMPLETED
from collections.abc import Callable
from typing import TypeVar

from blitzscale.cluster.mailbox import Mailbox
from blitzscale.errors import BlitzScaleError
from blitzscale.messages import Message, ReplyMsg, Result

Key = tuple[int, int]  # (rank, op id)
R = TypeVar("R", bound=Result)


def result_of(reply: ReplyMsg, kind: type[R]) -> R:
    """A successful reply's result, which must be of the command's result type."""
    if not isinstance(reply.result, kind):
        got = type(reply.result).__name__
        raise BlitzScaleError(f"rank {reply.rank} answered op {reply.op_id} with {got}, not {kind.__name__}")
    return reply.result


class ClusterOpError(BlitzScaleError):
    """A command failed on one or more workers; `replies` says what each one answered."""

    def __init__(self, what: str, replies: dict[int, ReplyMsg]) -> None:
        self.replies = replies
        errors = "; ".join(f"rank {r}: {m.error}" for r, m in sorted(replies.items()) if not m.ok)
        super().__init__(f"{what} failed: {errors}")

    @property
    def no_room(self) -> bool:
        """Every rank that failed did for want of device memory (nothing is wrong with it)."""
        failed = [m for m in self.replies.values() if not m.ok]
        return bool(failed) and all(m.no_room for m in failed)


class Calls:
    def __init__(
        self,
        mail: Mailbox,
        known_dead: Callable[[], set[int]],
        found_dead: Callable[[set[int]], list[int]],
        timeout_s: float,
    ) -> None:
        """`known_dead`: ranks the cluster counts dead; `found_dead(ranks)`: those of `ranks`
        whose process is gone now (the cluster forgets them); `timeout_s`: the default
        deadline of a call."""
        self._mail = mail
        self._known_dead = known_dead
        self._found_dead = found_dead
        self._timeout_s = timeout_s

    async def each(
        self, msgs: dict[int, Message], what: str, timeout_s: float | None = None
    ) -> dict[int, ReplyMsg]:
        """Send each rank its message and wait for all replies, by rank."""
        replies = await self.ops(list(msgs.items()), what, timeout_s)
        return {rank: replies[rank, msg.op_id] for rank, msg in msgs.items()}  # type: ignore[union-attr]

    async def each_ok(self, msgs: dict[int, Message], what: str) -> dict[int, ReplyMsg]:
        """`each`, raising ClusterOpError unless every reply is ok."""
        replies = await self.each(msgs, what)
        if not all(m.ok for m in replies.values()):
            raise ClusterOpError(what, replies)
        return replies

    async def ops(
        self,
        ops: list[tuple[int, Message]],
        what: str,
        timeout_s: float | None = None,
        on_reply: Callable[[ReplyMsg], None] | None = None,
    ) -> dict[Key, ReplyMsg]:
        """Send every (rank, message) in order (a rank may get several, and one plan's
        message goes to several ranks under one op id) and wait for all replies, keyed by
        (rank, op id); `on_reply` sees each as it arrives."""
        futures: dict[Key, asyncio.Future[ReplyMsg]] = {}
        dead = sorted({rank for rank, _ in ops} & self._known_dead())
        if dead:  # before anything is sent: no worker runs half an operation
            raise BlitzScaleError(f"{what}: worker {dead[0]} is dead")
        try:
            for rank, msg in ops:
                key = (rank, msg.op_id)  # type: ignore[union-attr]
                futures[key] = asyncio.wrap_future(self._mail.expect(*key))
                self._mail.send(rank, msg)
            return await self._replies(futures, timeout_s or self._timeout_s, on_reply)
        finally:
            self._mail.forget(list(futures))
            for f in futures.values():
                f.cancel()

    async def _replies(
        self,
        futures: dict[Key, asyncio.Future[ReplyMsg]],
        timeout_s: float,
        on_reply: Callable[[ReplyMsg], None] | None,
    ) -> dict[Key, ReplyMsg]:
        replies: dict[Key, ReplyMsg] = {}

        def got(reply: ReplyMsg) -> None:
            replies[reply.rank, reply.op_id] = reply
            if on_reply is not None:
                on_reply(reply)

        deadline = time.monotonic() + timeout_s
        while len(replies) < len(futures):
            pending = [k for k in futures if k not in replies]
            await asyncio.wait([futures[k] for k in pending], timeout=0.05, return_when=FIRST_COMPLETED)
            for k in pending:
                if futures[k].done():
                    got(futures[k].result())
            pending = [k for k in pending if k not in replies]
            ranks = {r for r, _ in pending}
            died = set(self._found_dead(ranks)) | (ranks & self._known_dead())
            for r, op in pending:
                if r in died:
                    got(ReplyMsg(op_id=op, rank=r, ok=False, error="worker died"))
            if time.monotonic() > deadline:
                for r, op in pending:
                    if (r, op) not in replies:
                        got(ReplyMsg(op_id=op, rank=r, ok=False, error="no reply in time"))
        return replies
