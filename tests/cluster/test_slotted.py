"""cluster/slotted.py over a stand-in cluster (a real ParameterPool, operations that wait on
the worker's line as the real ones do): slot ranks map to workers and back, a model takes at
most one slot of a worker, even while its load still waits for the worker, and a released
copy frees its slot for another model."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

import pytest

from blitzscale.cluster.commands import Activation
from blitzscale.cluster.config import ClusterConfig
from blitzscale.cluster.pool import ParameterPool
from blitzscale.cluster.slotted import SlottedCluster, free_slots, slotted
from blitzscale.core.config import EngineConfig
from blitzscale.messages import ActivateResult, LoadResult, ReleaseResult

WORKERS, SLOTS = 2, 3


@dataclass
class Inner:
    """Workers 0..WORKERS-1; a load takes the worker's line, then tells the pool."""

    cfg: ClusterConfig = field(default_factory=ClusterConfig)
    pool: ParameterPool = field(default_factory=ParameterPool)
    restarts: Counter[int] = field(default_factory=Counter)
    lines: dict[int, asyncio.Lock] = field(default_factory=dict)
    activated: list[tuple[int, int, str]] = field(default_factory=list)  # (worker, slot, model)
    world_size: int = WORKERS

    def alive_ranks(self) -> list[int]:
        return list(range(WORKERS))

    def nodes(self) -> tuple[str, ...]:
        return ("n0",) * WORKERS

    def line(self, w: int) -> asyncio.Lock:
        return self.lines.setdefault(w, asyncio.Lock())

    async def load(self, model: str, rank: int, source: str, **kw: object) -> LoadResult:
        async with self.line(rank):
            self.pool.begin_load(model, [rank])
            await asyncio.sleep(0)
            self.pool.commit_load(model, [rank])
        return LoadResult(path="disk", bytes=1, seconds=0.0)

    async def release(self, model: str, rank: int, host_copy: bool = False) -> ReleaseResult:
        async with self.line(rank):
            self.pool.release(model, rank)
        return ReleaseResult(freed_bytes=1)

    async def activate(self, ranks: dict[int, Activation]) -> dict[int, ActivateResult]:
        for w, a in ranks.items():
            self.activated.append((w, a.slot, a.model))
        return {w: ActivateResult(num_kv_blocks=1, max_model_len=8) for w in ranks}


def _act(model: str) -> Activation:
    return Activation(model=model, source=model, role="colocated", engine=EngineConfig())


def test_slot_ranks_map_to_workers_and_a_model_takes_one_slot_per_worker() -> None:
    async def main() -> None:
        inner = Inner()
        c = slotted(inner, SLOTS)  # type: ignore[arg-type]
        assert isinstance(c, SlottedCluster) and slotted(inner, 1) is inner  # type: ignore[arg-type]
        assert c.world_size == WORKERS * SLOTS and c.alive_ranks() == list(range(6))
        assert c.split(5) == (1, 2) and len(c.nodes()) == 6
        with pytest.raises(ValueError, match="beyond"):
            c.split(6)
        # a load of "a" into slot 1 of worker 0 (rank 2) waits for the worker's line: no
        # other slot of worker 0 is offered to "a" meanwhile, every slot of worker 1 is
        await inner.line(0).acquire()
        pending = asyncio.create_task(c.load("a", 2, "src"))
        await asyncio.sleep(0)
        assert "a" not in inner.pool.models_on(0)  # (the pool has not heard of it yet)
        assert free_slots(c, "a", [0, 1, 4, 5]) == (1,)  # worker 1's first free slot
        assert free_slots(c, "b", [0, 1, 4, 5]) == (0, 1)  # another model: worker 0 too
        inner.line(0).release()
        await pending
        assert c.pool.gpu_holders("a") == [2] and c.pool.models_on(2) == ["a"] and not c.pool.models_on(0)
        with pytest.raises(ValueError, match="already holds a in slot 1"):
            await c.load("a", 4, "src")  # (slot 2 of worker 0)
        # another model in another slot of the same worker, activated there by slot
        await c.load("b", 4, "src")
        got = await c.activate({2: _act("a"), 4: _act("b")})
        assert sorted(got) == [2, 4] and sorted(inner.activated) == [(0, 1, "a"), (0, 2, "b")]
        # the instances' own ranks also bar their workers (a load just launched)
        assert free_slots(c, "c", [0, 1]) == (0, 1) and free_slots(c, "c", [0, 1], instances=[3]) == (0,)
        # a released copy frees the slot: "a" may come back in another slot of worker 0
        await c.release("a", 2)
        assert c.pool.gpu_holders("a") == [] and free_slots(c, "a", [0]) == (0,)
        await c.load("a", 0, "src")
        assert c.pool.gpu_holders("a") == [0] and c.pool.gpu_holders("b") == [4]

    asyncio.run(main())
