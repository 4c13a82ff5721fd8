"""Dead workers come back: each one found dead is respawned by the cluster backend, its
links rebuilt, and the rank is handed back to the planner holding nothing.

A rank that keeps dying is given up on after `max_restarts` respawns (it stays out of the
pool, with a log line); a respawn that fails is retried after a pause that doubles (up to a
minute), and each failed try counts against `max_restarts` too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from blitzscale.cluster.base import Cluster

log = logging.getLogger("blitzscale.router")
RETRY_S = 1.0  # after a failed respawn; doubles each time, up to MAX_RETRY_S
MAX_RETRY_S = 60.0


class Respawner:
    def __init__(self, cluster: Cluster, max_restarts: int, on_back: Callable[[int], None]) -> None:
        self.cluster = cluster
        self.max_restarts = max_restarts
        self.on_back = on_back  # called on the loop when a rank is back, holding nothing
        self.deaths = 0  # workers found dead, all ranks
        self.given_up: set[int] = set()
        self._tasks: dict[int, asyncio.Task[None]] = {}

    @property
    def restarts(self) -> int:
        return sum(self.cluster.restarts.values())

    def died(self, rank: int) -> None:
        """`rank` was found dead (and forgotten by the cluster): bring it back, if allowed."""
        self.deaths += 1
        if rank in self._tasks:
            return
        if self.cluster.restarts[rank] >= self.max_restarts:
            if rank not in self.given_up:
                self.given_up.add(rank)
                log.error(
                    "worker %d died after %d restarts: it stays out of the pool", rank, self.max_restarts
                )
            return
        self._tasks[rank] = asyncio.get_running_loop().create_task(self._respawn(rank))

    def restart(self, rank: int) -> None:
        """Replace a live worker that cannot be trusted any more (its loads keep failing):
        it is killed here, found dead by the health check, and respawned like any death."""
        pool = self.cluster.pool
        if self.cluster.restarts[rank] >= self.max_restarts:
            return  # it would not come back: leave it out of service, as it is
        if pool.models_on(rank) or rank in pool.host_ranks():
            return  # it still holds a copy someone may need
        if rank in self.cluster.alive_ranks():
            log.warning("restarting worker %d: its loads keep failing", rank)
            self.cluster.kill(rank)

    async def _respawn(self, rank: int) -> None:
        pause = RETRY_S
        tries = 0
        try:
            while self.cluster.restarts[rank] + tries < self.max_restarts:
                try:
                    await self.cluster.respawn(rank)
                except Exception as e:  # any failure is this try's; the task goes on
                    tries += 1
                    log.error("respawning worker %d failed (next try in %.0f s): %s", rank, pause, e)
                    await asyncio.sleep(pause)
                    pause = min(MAX_RETRY_S, 2 * pause)
                    continue
                self.on_back(rank)
                return
            self.given_up.add(rank)
            log.error("worker %d could not be respawned: it stays out of the pool", rank)
        finally:
            self._tasks.pop(rank, None)

    async def stop(self) -> None:
        for t in self._tasks.values():
            t.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
