"""What the control plane needs of a cluster of workers, whatever runs them.

`LocalCluster` implements it, its workers local processes or Ray actors across nodes
(`cluster/spawn.py`); the simulated backend implements the same. Every operation is async
and returns when it is done: operations on different ranks run side by side, operations on
one rank in the order they were called.
A failed operation raises `BlitzScaleError` (a `ClusterOpError` names each rank's answer);
one that succeeds returns its typed result (cluster/results.py, and the workers' replies in
messages.py): never a dict read by key.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Protocol

from blitzscale.cluster.commands import Activation, CostQuery, LiveStart
from blitzscale.cluster.config import ClusterConfig
from blitzscale.cluster.pool import ParameterPool
from blitzscale.cluster.results import ClusterStatus, PrefixShipResult, RespawnResult, TransferResult
from blitzscale.control.costmodel import CostReport
from blitzscale.core.roles import Role
from blitzscale.messages import ActivateResult, HostCopyResult, LoadResult, ReleaseResult


class Cluster(Protocol):
    cfg: ClusterConfig
    pool: ParameterPool  # where every copy is; the cluster writes it, the control plane reads
    restarts: Counter[int]  # respawns that succeeded, by rank

    @property
    def world_size(self) -> int: ...

    # --- status ---------------------------------------------------------------------------

    def alive_ranks(self) -> list[int]: ...

    def nodes(self) -> tuple[str, ...]:
        """The node each rank runs on, by rank: ranks of one node share NVLink and host
        memory (plans keep chains inside a node first; sllm's host cache is per node)."""
        ...

    def dead_now(self) -> set[int]:
        """Ranks with no live worker now; each newly dead one is forgotten by the pool."""
        ...

    def status(self) -> ClusterStatus: ...

    # --- loads: disk (local source), network (device copies), host (the one host copy) ---

    async def load(
        self, model: str, rank: int, source: str, *, max_bytes_per_s: float = 0.0, cold: bool = False
    ) -> LoadResult:
        """`cold`: read from the disk itself (no page cache), as a scale-up from an SSD."""
        ...

    async def transfer(
        self,
        model: str,
        source: str,
        sources: list[int],
        targets: list[int],
        *,
        from_host: bool = False,
        live: dict[int, Activation] | None = None,
        on_live: Callable[[LiveStart], None] | None = None,
        may_join: bool = True,
    ) -> dict[int, TransferResult]:
        """One result per receiving rank. `live`: engines started on targets right behind
        the transfer, serving while the weights arrive; `on_live` sees each start.
        `may_join`: while the sources send an earlier load of the model, join its chain
        (cluster/flights.py) rather than wait for them."""
        ...

    async def cache_on_host(self, model: str, rank: int) -> HostCopyResult: ...

    async def release_host_copy(self, model: str) -> None: ...

    # --- serving ------------------------------------------------------------------------

    async def activate(self, ranks: dict[int, Activation]) -> dict[int, ActivateResult]: ...

    async def set_role(self, rank: int, role: Role) -> None: ...

    async def ship_prefixes(self, model: str, src: int, dst: int, max_blocks: int) -> PrefixShipResult:
        """Up to `max_blocks` of the most reused cached prefix blocks of `src`'s engine of
        `model` into `dst`'s (a new instance of it), over their KV link; both serve it."""
        ...

    async def deactivate(self, rank: int) -> None: ...

    # --- the rest -----------------------------------------------------------------------

    async def release(self, model: str, rank: int, host_copy: bool = False) -> ReleaseResult: ...

    async def checksum(self, model: str, rank: int, host_copy: bool = False) -> str: ...

    async def cost_report(self, rank: int, query: CostQuery) -> CostReport:
        """What `query.model` costs on `rank`'s device (measured there, or read back)."""
        ...

    async def respawn(self, rank: int) -> RespawnResult: ...

    def kill(self, rank: int) -> None: ...
