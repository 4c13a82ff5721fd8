"""The KV block books of one engine: who holds which block, checked against the pool."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from blitzscale.engine.request import Request
from blitzscale.kvcache.pool import BlockPool


def kv_problems(pool: BlockPool, owners: Iterable[Request], reserved: Iterable[int] = ()) -> list[str]:
    """What is wrong (empty: nothing): the pool's own books, a block held twice by one
    request, a block several requests hold that is not a cached prefix, a block whose
    holders are not the pool's count of them, a block a request holds that the pool calls
    free, a used block nobody holds (a leak). `owners` may name a request more than once
    (it sits in several containers); `reserved` blocks are held by the books themselves
    (one holder each)."""
    problems = pool.check()
    holders: Counter[int] = Counter()
    for req in {id(r): r for r in owners}.values():
        if len(set(req.block_ids)) != len(req.block_ids):
            problems.append(f"request {req.request_id!r} holds a block twice")
        holders.update(req.block_ids)
    holders.update(reserved)
    for b, n in holders.items():
        if n > 1 and not pool.is_registered(b):
            problems.append(f"block {b} held by {n} requests but not a cached prefix")
        if pool.refs(b) not in (0, n):
            problems.append(f"block {b} has {n} holders, the pool counts {pool.refs(b)}")
    owned, used = set(holders), pool.used_ids
    if owned - used:
        problems.append(f"requests hold blocks the pool calls free: {sorted(owned - used)[:8]}")
    if used - owned:
        problems.append(f"{len(used - owned)} used blocks belong to no request (leaked)")
    return problems
