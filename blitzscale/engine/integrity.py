"""The KV block books of one engine: who owns which block, checked against the pool."""

from __future__ import annotations

from collections.abc import Iterable

from blitzscale.engine.request import Request
from blitzscale.kvcache.pool import BlockPool


def kv_problems(pool: BlockPool, owners: Iterable[Request]) -> list[str]:
    """What is wrong (empty: nothing): the pool's own books, a block with two owners, a
    block a request holds that the pool calls free, a used block nobody holds (a leak).
    `owners` may name a request more than once (it sits in several containers)."""
    problems = pool.check()
    by_block: dict[int, Request] = {}
    for req in {id(r): r for r in owners}.values():
        for b in req.block_ids:
            other = by_block.setdefault(b, req)
            if other is not req:
                problems.append(f"block {b} owned by {other.request_id!r} and {req.request_id!r}")
    owned, used = set(by_block), pool.used_ids
    if owned - used:
        problems.append(f"requests hold blocks the pool calls free: {sorted(owned - used)[:8]}")
    if used - owned:
        problems.append(f"{len(used - owned)} used blocks belong to no request (leaked)")
    return problems
