"""The engine's one request table: every request it knows, by id, with a checked status.

Requests enter here (`add`), change status here (`move`, checked against TRANSITIONS) and
leave here (`release`, the one path that frees a request's KV blocks for good; preemption
gives them back through `drop_blocks` and recomputes later). The scheduler's queue and
batch and the live queue only order requests; what a request *is* is its status here.
Blocks held by no request (hot prefixes on their way in) are the table's too:
`reserve_blocks`, then `free_reserved`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from blitzscale.engine.integrity import kv_problems
from blitzscale.engine.request import Request, RequestStatus
from blitzscale.errors import InvalidRequestError
from blitzscale.kvcache.pool import BlockPool

S = RequestStatus
# status -> the statuses it may move to (entering: ENTRY)
ENTRY = {S.WAITING, S.LIVE, S.IMPORTING, S.RELAYED_IN}
TRANSITIONS: dict[RequestStatus, set[RequestStatus]] = {
    S.WAITING: {S.RUNNING, S.FINISHED},
    S.RUNNING: {S.WAITING, S.HELD, S.FINISHED},  # preempted, prefilled for migration, done
    S.HELD: {S.RUNNING, S.FINISHED},  # adopted here (mutation), or sent / dropped
    S.IMPORTING: {S.RUNNING, S.FINISHED},
    S.LIVE: {S.RUNNING, S.RELAYING, S.FINISHED},
    S.RELAYING: {S.LIVE, S.WAITING, S.FINISHED},  # not taken: back in the live queue or, once
    S.RELAYED_IN: {S.RUNNING, S.FINISHED},  # loaded, in the scheduler's
    S.FINISHED: set(),
}
# What the engine's step works on (the others wait for the serving loop's migrations).
STEPPED = (S.WAITING, S.RUNNING, S.LIVE, S.RELAYED_IN)


class RequestStateError(RuntimeError):
    """A request was asked to make a move its status does not allow (an engine bug)."""


class RequestTable:
    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self._reqs: dict[str, Request] = {}
        self._reserved: set[int] = set()  # held by no request: hot prefixes arriving

    def reserve_blocks(self, num_blocks: int) -> list[int]:
        """Blocks held by the table itself until `free_reserved`."""
        ids = self.pool.allocate(num_blocks)
        self._reserved.update(ids)
        return ids

    def free_reserved(self, block_ids: list[int]) -> None:
        if not self._reserved.issuperset(block_ids):
            raise RequestStateError(f"blocks {sorted(set(block_ids) - self._reserved)[:8]} were not reserved")
        self._reserved.difference_update(block_ids)
        self.pool.free(block_ids)

    def add(self, req: Request, status: RequestStatus) -> None:
        if req.request_id in self._reqs:
            raise InvalidRequestError(f"request id {req.request_id!r} is already in use")
        if status not in ENTRY:
            raise RequestStateError(f"a request cannot enter as {status.value}")
        req.status = status
        self._reqs[req.request_id] = req

    def get(self, request_id: str, *statuses: RequestStatus) -> Request | None:
        """The request, if it is here (and, given `statuses`, in one of them)."""
        req = self._reqs.get(request_id)
        return req if req is not None and (not statuses or req.status in statuses) else None

    def move(self, req: Request, new: RequestStatus) -> None:
        if self._reqs.get(req.request_id) is not req:
            raise RequestStateError(f"request {req.request_id!r} is not in this engine")
        if new is not req.status and new not in TRANSITIONS[req.status]:
            raise RequestStateError(f"request {req.request_id!r}: {req.status.value} -> {new.value}")
        req.status = new

    def release(self, req: Request, reason: str | None = None) -> None:
        """The request is done here (finished, aborted, failed, sent elsewhere): its blocks
        go back and it leaves the table. Releasing a released request does nothing."""
        if req.status is S.FINISHED:
            return
        self.move(req, S.FINISHED)
        self.drop_blocks(req)
        if reason is not None:
            req.finish_reason = reason
        del self._reqs[req.request_id]

    def trim_blocks(self, req: Request, keep: int) -> None:
        """Give back the request's blocks after its first `keep` (allocated for a step that
        did not run: none of them is computed, shared or cached)."""
        if keep < len(req.block_ids):
            self.pool.free(req.block_ids[keep:])
            del req.block_ids[keep:]

    def drop_blocks(self, req: Request) -> None:
        self.pool.free(req.block_ids)
        req.block_ids = []
        req.num_registered = 0

    def ids(self, *statuses: RequestStatus) -> list[str]:
        return [rid for rid, r in self._reqs.items() if not statuses or r.status in statuses]

    def requests(self, *statuses: RequestStatus) -> list[Request]:
        return [r for r in self._reqs.values() if not statuses or r.status in statuses]

    def count(self, *statuses: RequestStatus) -> int:
        return sum(1 for r in self._reqs.values() if not statuses or r.status in statuses)

    def counts(self) -> Counter[RequestStatus]:
        return Counter(r.status for r in self._reqs.values())

    def __len__(self) -> int:
        return len(self._reqs)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._reqs))

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._reqs

    def problems(self) -> list[str]:
        """The KV books (every used block owned by exactly one request here, free + used =
        total) and the table's own (no finished request kept)."""
        problems = kv_problems(self.pool, self._reqs.values(), self._reserved)
        for rid, r in self._reqs.items():
            if r.is_finished:
                problems.append(f"request {rid!r} is finished but still here")
        return problems
