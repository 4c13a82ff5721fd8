"""Continuous batching: every step decodes all running requests and prefills new ones.

Each scheduled request gets a number of new tokens: 1 for a decode, up to the remaining
token budget for a prompt (long prompts are prefilled in chunks). KV blocks are allocated
as tokens need them; when none are left, the most recently admitted request is preempted
(its blocks freed, recomputed later), and waiting requests queue until blocks free up.
The scheduler orders requests; their statuses are the request table's (engine/table.py).
After a step ran out of device memory, `cap` (engine/oom.py) holds steps to fewer tokens
and rows than configured, and running requests past its rows are preempted the same way.

With prefix caching, a request admitted from the queue first takes the cached blocks of
its prompt's longest cached prefix (kvcache/pool.py: full blocks, never its last token,
which must be computed to sample), and computes only the rest; the engine offers each
request's blocks to the cache as their tokens are computed (`cache_computed`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from blitzscale.engine.oom import StepCap
from blitzscale.engine.request import Request, RequestStatus
from blitzscale.engine.table import RequestTable
from blitzscale.kvcache.pool import BlockPool
from blitzscale.kvcache.prefix import ROOT, extend_hashes


@dataclass(frozen=True)
class ScheduledRequest:
    request: Request
    num_new_tokens: int

    @property
    def completes_prompt(self) -> bool:
        """After this step every known token is computed, so a new token is sampled."""
        r = self.request
        return r.num_computed_tokens + self.num_new_tokens == r.num_tokens


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest]
    num_preempted: int

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(
        self,
        pool: BlockPool,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        table: RequestTable | None = None,
        prefix_caching: bool = False,
    ) -> None:
        self.pool = pool
        self.table = table if table is not None else RequestTable(pool)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.prefix_caching = prefix_caching
        self.cap: StepCap | None = None  # smaller steps after running out of memory
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0  # of those, tokens found there (not computed again)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, req: Request) -> None:
        """A new request (it enters the table as WAITING)."""
        self.table.add(req, RequestStatus.WAITING)
        self.waiting.append(req)

    def schedule(self) -> SchedulerOutput:
        budget, max_seqs = self.max_num_batched_tokens, self.max_num_seqs
        scheduled: list[ScheduledRequest] = []
        num_preempted = 0
        if self.cap is not None:  # (engine/oom.py: the engine has read every pending token)
            budget, max_seqs = min(budget, self.cap.tokens), min(max_seqs, self.cap.seqs)
            while len(self.running) > max_seqs:
                self._preempt(self.running.pop())
                num_preempted += 1
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            need = self._blocks_needed(req, n)
            while not self.pool.can_allocate(need) and self.running[-1] is not req:
                self._preempt(self.running.pop())
                num_preempted += 1
            if not self.pool.can_allocate(need):
                self._preempt(self.running.pop(i))
                num_preempted += 1
                break
            req.block_ids += self.pool.allocate(need)
            scheduled.append(ScheduledRequest(req, n))
            budget -= n
            i += 1
        while self.waiting and budget > 0 and len(self.running) < max_seqs:
            req = self.waiting[0]
            hit = self._cached_prefix(req)
            start = max(req.num_computed_tokens, len(hit) * self.pool.block_size)
            n = min(req.num_tokens - start, budget)
            need = self.pool.blocks_for_tokens(start + n) - len(req.block_ids) - len(hit)
            if not self.pool.can_allocate(need + self.pool.num_idle(hit)):
                break
            self.waiting.popleft()
            if hit:
                self.pool.share(hit)
                req.block_ids += hit
                req.num_computed_tokens = start
                self.prefix_hits += start
            if self.prefix_caching and req.cacheable and not req.needs_prompt_logits:
                self.prefix_queries += req.num_tokens
            req.block_ids += self.pool.allocate(need)
            self.table.move(req, RequestStatus.RUNNING)
            self.running.append(req)
            scheduled.append(ScheduledRequest(req, n))
            budget -= n
        return SchedulerOutput(scheduled, num_preempted)

    def _cached_prefix(self, req: Request) -> list[int]:
        """The cached blocks a request about to be admitted can take: the longest cached
        run of its full blocks, short of its last token (empty without prefix caching, for a
        request that already holds blocks, or for one that asks for its prompt's logprobs,
        which need every position's logits)."""
        if not self.prefix_caching or req.block_ids or req.num_computed_tokens or not req.cacheable:
            return []
        if req.needs_prompt_logits:
            return []
        bs = self.pool.block_size
        full = (req.num_tokens - 1) // bs
        return self.pool.cached_prefix(extend_hashes(req.block_hashes, req.token_ids, full, bs))

    def cache_computed(self, req: Request, known_tokens: int) -> None:
        """Offer the prefix cache the request's full blocks whose tokens are computed and
        known on the host (`known_tokens`: a token still on the device is not)."""
        if not self.prefix_caching or not req.cacheable:
            return
        bs = self.pool.block_size
        full = min(req.num_computed_tokens, known_tokens, len(req.block_ids) * bs) // bs
        if full <= req.num_registered:
            return
        hashes = extend_hashes(req.block_hashes, req.token_ids, full, bs)
        for i in range(req.num_registered, full):
            self.pool.register(req.block_ids[i], hashes[i], hashes[i - 1] if i else ROOT)
        req.num_registered = full

    def finish(self, req: Request, reason: str) -> None:
        """Take a request out (finished or aborted); the table releases its KV blocks."""
        self.remove(req)
        self.table.release(req, reason)

    def remove(self, req: Request) -> None:
        """Take a request out of the queue or the batch, whatever it is."""
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status is RequestStatus.WAITING:
            self.waiting.remove(req)

    def detach(self, req: Request) -> None:
        """Take a running request out but keep its KV blocks (they are about to migrate)."""
        self.running.remove(req)
        self.table.move(req, RequestStatus.HELD)

    def add_running(self, req: Request) -> None:
        """Admit a request whose KV is in place (blocks allocated): it arrived from
        elsewhere, was computed outside the scheduler, or is adopted."""
        self.table.move(req, RequestStatus.RUNNING)
        self.running.append(req)

    def requeue(self, req: Request) -> None:
        """A request back at the head of the queue (it holds no blocks)."""
        self.table.move(req, RequestStatus.WAITING)
        self.waiting.appendleft(req)

    def _blocks_needed(self, req: Request, num_new_tokens: int) -> int:
        total = self.pool.blocks_for_tokens(req.num_computed_tokens + num_new_tokens)
        return max(0, total - len(req.block_ids))

    def _preempt(self, req: Request) -> None:
        self.table.drop_blocks(req)
        req.num_computed_tokens = 0  # (its cached blocks may still be there when it comes back)
        self.requeue(req)
