"""Overlapped decoding: one step in flight while the CPU prepares the next.

Without it a GPU step waits for its sampled tokens, then the CPU checks stops, makes the
outputs, schedules and builds the next step while the GPU idles: 0.3-1.5 ms a step on an
H200, 10-25% of a decode step at the roofline. With it the engine launches step N+1 before
it reads step N's tokens: each request whose token is still on the device holds `PENDING`
as its last id, and step N+1 takes that token as its input straight from step N's device
tensor (`patch_pending`). The engine then reads step N's tokens (the GPU is already busy
with N+1), runs its stop checks and emits its outputs. A request that stopped at step N
got one more token computed in N+1; that row is dropped. SGLang's overlap scheduler works
the same way.

Only plain decoding overlaps (the engine checks before it launches a step with pending
tokens): nothing waiting to be admitted, no live or relayed work, no aborted output to
send, no request that holds its KV for migration or draws from its own seeded generator,
none with logits processors or logprobs (they read their own tokens every step), none at
its length limit, and KV blocks for every running request without preemption.
Anything else reads the step in flight first and goes on as without overlap, so a request
never reaches a queue, an output or another instance with a pending token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from blitzscale.engine.request import Request, RequestStatus
from blitzscale.engine.sampler import sample_async
from blitzscale.engine.scheduler import Scheduler
from blitzscale.engine.sync import wait_for_event
from blitzscale.kvcache.pool import BlockPool

PENDING = -2  # a token id still on the device (never a real id, nor the sampler's NO_TOKEN)
Emit = Callable[[Request, int], None]


@dataclass
class InFlight:
    """A launched step's sampled tokens: on the device for the next step's input, and on
    their way to a pinned host buffer for the engine."""

    requests: list[Request]  # the rows, in order
    tokens: torch.Tensor  # [n] device ids (a failed row holds 0: its request fails on read)
    host: torch.Tensor  # [n] the same ids on the host (NO_TOKEN for a failed row)
    ready: torch.cuda.Event | None  # recorded after the copy to `host` (None on CPU)
    rows: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.rows = {r.request_id: i for i, r in enumerate(self.requests)}

    def read(self) -> list[int]:
        """The sampled ids, once this step (and nothing after it) has run."""
        if self.ready is not None:
            wait_for_event(self.ready)
        return self.host.tolist()


def patch_pending(ids: torch.Tensor, dst: list[int], src: list[int], tokens: torch.Tensor) -> None:
    """ids[dst[i]] = tokens[src[i]], on the device, after the step's inputs have been
    copied there (stream order) and before it runs."""
    if not dst:
        return
    k = len(dst)
    if dst == src == list(range(k)):  # the usual case: the same batch, in the same order
        ids[:k].copy_(tokens[:k])
        return
    idx = torch.tensor([dst, src], dtype=torch.long)
    if ids.device.type == "cuda":
        idx = idx.pin_memory().to(ids.device, non_blocking=True)
    ids[idx[0]] = tokens[idx[1]]


def plain(req: Request) -> bool:
    """A request whose next token can be read a step late: it neither holds its KV for
    migration after its first token, nor draws from its own seeded generator, nor reads
    its own token history or logprobs every step (penalties, logit_bias, min_tokens)."""
    if req.hold_kv or req.params.reads_every_step:
        return False
    return req.params.is_greedy or req.generator is None


class Overlap:
    """The engine's step in flight. The engine owns it and is its only caller; the `emit`
    it passes hands a read token to the engine's stop checks and outputs (passed per call:
    held here it would tie the engine into a reference cycle, and its KV cache would
    outlive it until the garbage collector ran)."""

    def __init__(
        self,
        scheduler: Scheduler,
        pool: BlockPool,
        max_num_batched_tokens: int,
        max_model_len: int,
    ) -> None:
        self.scheduler = scheduler
        self.pool = pool
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.in_flight: InFlight | None = None
        self.steps = 0  # steps launched before the last one's tokens were read

    @property
    def busy(self) -> bool:
        return self.in_flight is not None

    def launch(self, sampling: list[Request], logits: torch.Tensor, emit: Emit) -> None:
        """Sample without waiting; then read the step launched before this one (the GPU
        runs this one meanwhile) and mark this one's tokens pending."""
        tokens, host, ready = sample_async(logits, [r.params for r in sampling])
        previous, self.in_flight = self.in_flight, InFlight(sampling, tokens, host, ready)
        if previous is not None:
            self.steps += 1
            self._read(previous, emit)
        for r in sampling:
            if r.status is RequestStatus.RUNNING:  # (not one that just stopped: its row is dropped)
                r.token_ids.append(PENDING)

    def settle(self, emit: Emit) -> None:
        """Read the step in flight, if any: its tokens replace the pending ones."""
        record, self.in_flight = self.in_flight, None
        if record is not None:
            self._read(record, emit)

    def _read(self, record: InFlight, emit: Emit) -> None:
        for req, tok in zip(record.requests, record.read(), strict=True):
            if req.status is RequestStatus.RUNNING and req.token_ids[-1] == PENDING:
                req.token_ids.pop()
                emit(req, tok)

    def drop(self) -> None:
        """A step raised: the tokens in flight are not read (their requests fail)."""
        record, self.in_flight = self.in_flight, None
        for req in record.requests if record is not None else []:
            if req.token_ids and req.token_ids[-1] == PENDING:
                req.token_ids.pop()

    def can_continue(self) -> bool:
        """Can the next step launch before the one in flight is read, as far as the running
        batch goes (the engine checks the rest)? Every running request is plain, none is at
        its length limit with its pending token, there is nothing to admit, and blocks
        and token budget suffice for all without preemption."""
        if self.scheduler.waiting:
            return False
        need = tokens = 0
        for r in self.scheduler.running:
            if not plain(r):
                return False
            if r.token_ids[-1] == PENDING and (
                r.num_output_tokens >= r.params.max_tokens or r.num_tokens >= self.max_model_len
            ):
                return False  # it stops there: read it first
            tokens += r.num_tokens - r.num_computed_tokens
            need += max(0, self.pool.blocks_for_tokens(r.num_tokens) - len(r.block_ids))
        return tokens <= self.max_num_batched_tokens and self.pool.can_allocate(need)
