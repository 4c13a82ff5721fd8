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
    async def holding(
        self, ranks: list[int] | list[str], sharing: list[int] | tuple[int, ...] = ()
    ) -> AsyncIterator[None]:
        """Operations on one rank run in the order they were called; on different ranks,
        side by side. An operation takes its place in every one of its ranks' lines at
        once, when it is called, and waits for the operation ahead of it in each (those
        were called earlier, so no two operations ever wait on each other).

        `sharing`: ranks whose current operation this one runs beside (a load joining the
        chain in flight through that chain's last target): it takes its place in their
        lines without waiting, and those behind it there wait for both."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a blocking caller runs each call on a loop of its own
            self._loop, self._lines = loop, {}
        mine: asyncio.Future[None] = loop.create_future()
        ahead, beside = [], []
        keys = set(ranks) | set(sharing)
        for key in keys:
            line = self._lines.setdefault(key, [])
            if line:
                (beside if key in sharing and key not in ranks else ahead).append(line[-1])
            line.append(mine)
        lines = self._lines

        def release(*_: object) -> None:
            mine.set_result(None)
            for key in keys:
                lines[key].remove(mine)

        try:
            for f in ahead:
                await asyncio.shield(f)
            yield
        finally:
            # cancelled while it waited, or ran beside ones still going: those behind it
            # must still wait for them
            waiting = [f for f in ahead + beside if not f.done()]
            if waiting:  # those behind it must still wait for the ones ahead of it
                asyncio.gather(*waiting).add_done_callback(release)
            else:
                release()
