"""One simulated engine step, as `LLMEngine._step` takes it (engine/engine.py) less the
forward pass: the live queue's stage, the relayed prompts that arrived, then the
scheduler's batch; its `StepWork` is what the profile times (worker/pacing.py's `step_s`,
the paced worker's rule). And how many decode-only steps can be taken in one jump.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from blitzscale.engine.live_order import LiveOrder, LiveTask
from blitzscale.engine.request import Request, RequestStatus
from blitzscale.engine.scheduler import ScheduledRequest, Scheduler
from blitzscale.engine.table import RequestTable
from blitzscale.engine.work import StepWork
from blitzscale.kvcache.pool import BlockPool

S = RequestStatus


@dataclass
class LiveStage:
    """The live queue's batch in this step and the layers it runs (engine/live_order.py)."""

    batch: list[LiveTask]
    stage: int
    layers: tuple[int, int]
    loading: bool


@dataclass
class Step:
    work: StepWork = field(default_factory=StepWork)
    rows: list[ScheduledRequest] = field(default_factory=list)  # the scheduler's batch
    live: LiveStage | None = None  # a layer stage run during the step
    completed: list[Request] = field(default_factory=list)  # prompts done outside the scheduler
    prompts: list[Request] = field(default_factory=list)  # rows computing their prompt
    num_preempted: int = 0

    @property
    def is_empty(self) -> bool:
        return not (self.rows or self.live or self.completed)

    def decode_only(self, scheduler: Scheduler) -> bool:
        """Only decode rows, every running request among them: until a request finishes, a
        message comes or blocks run out, the next steps are the same (one token longer)."""
        return (
            bool(self.rows)
            and self.live is None
            and not self.completed
            and not self.num_preempted
            and len(self.rows) == len(scheduler.running)
            and all(s.num_new_tokens == 1 and s.request.num_output_tokens >= 1 for s in self.rows)
        )


def plan(
    live: LiveOrder | None,
    table: RequestTable,
    scheduler: Scheduler,
    num_layers: int,
    sample: Callable[[Request], None],
) -> Step:
    """The step to run now, as the engine's step chooses it. Prompts completed outside the
    scheduler (a live head stage, relayed prompts) join the batch and are `sample`d first,
    as the engine does, so they decode in this very step."""
    step = Step()
    if live is not None:
        batch = live.next_batch()
        while batch and batch[0].stage in (0, live.head_stage):  # embedding, head: too cheap to time
            step.completed += live.ran(batch, batch[0].stage)
            batch = live.next_batch()
        if batch:
            stage = batch[0].stage
            loading = not live.readiness.all_ready
            layers = live.layers(stage, loading)
            step.live = LiveStage(batch, stage, layers, loading)
            share = (layers[1] - layers[0]) / num_layers
            step.work.partial.append((sum(t.request.num_tokens for t in batch), share))
    ready = [r for r in table.requests(S.RELAYED_IN) if r.handoff is not None and r.handoff.ready]
    for r in ready:
        layer = r.handoff.layer if r.handoff is not None else 0
        step.work.partial.append((r.num_tokens, (num_layers - layer) / num_layers))
        r.handoff = None
        r.num_computed_tokens = r.num_tokens
    step.completed += ready
    for r in step.completed:
        scheduler.add_running(r)
        sample(r)
    if live is not None and not live.readiness.all_ready:
        return step  # nothing else can run on a partial model
    sched = scheduler.schedule()
    step.rows, step.num_preempted = sched.scheduled, sched.num_preempted
    for s in sched.scheduled:  # (a row of one new token attends like a decode row)
        if s.num_new_tokens == 1:
            step.work.decode_contexts.append(s.request.num_computed_tokens + 1)
        else:
            step.work.prompt_tokens += s.num_new_tokens
        if s.request.num_output_tokens == 0:
            step.prompts.append(s.request)
    return step


def decode_run(rows: list[ScheduledRequest], pool: BlockPool, max_model_len: int) -> int:
    """How many decode steps, this one first, can run before any request stops (the last
    of them may stop some) and without preempting: every later step allocates its blocks."""
    k = min(_steps_to_stop(s.request, max_model_len) for s in rows)
    if k <= 1 or _extra_blocks(rows, pool, k) <= pool.num_free_blocks:
        return max(1, k)
    lo, hi = 1, k  # lo fits, hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _extra_blocks(rows, pool, mid) <= pool.num_free_blocks:
            lo = mid
        else:
            hi = mid
    return lo


def _steps_to_stop(r: Request, max_model_len: int) -> int:
    """Steps until `r` stops by length (1 if any other stop could come at its next token)."""
    p = r.params
    if 0 in p.stop_token_ids or p.stop:  # (a simulated token is 0, its text empty)
        return 1
    by_tokens = p.max_tokens - r.num_output_tokens
    by_context = max_model_len - r.num_tokens
    return max(1, min(by_tokens, by_context))


def _extra_blocks(rows: list[ScheduledRequest], pool: BlockPool, k: int) -> int:
    """Blocks `k` steps need beyond what this step's schedule allocated (it has room for
    one more token each; after `k` steps each has computed k more)."""
    return sum(
        max(0, pool.blocks_for_tokens(s.request.num_computed_tokens + k) - len(s.request.block_ids))
        for s in rows
    )


def reserve(rows: list[ScheduledRequest], pool: BlockPool, steps: int) -> None:
    """Take now the blocks `steps` decode steps of `rows` need (`decode_run` said they are
    free): a message handled during the run (a KV arrival reserving blocks) must not take
    them, or the steps already run would find none (the engine's task died on it)."""
    for s in rows:
        r = s.request
        need = pool.blocks_for_tokens(r.num_computed_tokens + steps) - len(r.block_ids)
        if need > 0:
            r.block_ids += pool.allocate(need)


def unreserve(rows: list[ScheduledRequest], pool: BlockPool, steps: int) -> None:
    """A run cut after `steps`: the blocks reserved for the steps that did not run go back."""
    for s in rows:
        r = s.request
        if r.status is not S.RUNNING:
            continue  # (aborted: its blocks went with it)
        keep = max(pool.blocks_for_tokens(r.num_computed_tokens + steps), 1)
        if len(r.block_ids) > keep:
            extra, r.block_ids = r.block_ids[keep:], r.block_ids[:keep]
            pool.free(extra)


def advance(rows: list[ScheduledRequest], pool: BlockPool, steps: int) -> list[Request]:
    """Decode rows after `steps` steps (blocks allocated as the scheduler would have, every
    token but the last appended): the requests still here, each about to sample its last.
    Rows whose request left meanwhile (aborted) are skipped."""
    alive = []
    for s in rows:
        r = s.request
        if r.status is not S.RUNNING:
            continue
        r.num_computed_tokens += steps
        need = pool.blocks_for_tokens(r.num_computed_tokens) - len(r.block_ids)
        if need > 0:
            r.block_ids += pool.allocate(need)
        r.token_ids += [0] * (steps - 1)
        alive.append(r)
    return alive
