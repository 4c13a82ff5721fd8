"""Per-rank order for cluster operations: each rank has a line of the operations on it,
oldest first. Pure asyncio bookkeeping, owned by the cluster."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class RankLines:
    def __init__(self) -> None:
        self._lines: dict[int | str, list[asyncio.Future[None]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    @contextlib.asynccontextmanager
    async def holding(self, ranks: list[int] | list[str]) -> AsyncIterator[None]:
        """Operations on one rank run in the order they were called; on different ranks,
        side by side. An operation takes its place in every one of its ranks' lines at
        once, when it is called, and waits for the operation ahead of it in each (those
        were called earlier, so no two operations ever wait on each other)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a blocking caller runs each call on a loop of its own
            self._loop, self._lines = loop, {}
        mine: asyncio.Future[None] = loop.create_future()
        ahead = []
        for key in set(ranks):
            line = self._lines.setdefault(key, [])
            if line:
                ahead.append(line[-1])
            line.append(mine)
        lines = self._lines

        def release(*_: object) -> None:
            mine.set_result(None)
            for key in set(ranks):
                lines[key].remove(mine)

        try:
            for f in ahead:
                await asyncio.shield(f)
            yield
        finally:
            waiting = [f for f in ahead if not f.done()]  # cancelled while it waited
            if waiting:  # those behind it must still wait for the ones ahead of it
                asyncio.gather(*waiting).add_done_callback(release)
            else:
                release()
