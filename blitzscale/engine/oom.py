"""Out of device memory inside a step: smaller steps, not failed requests.

KV blocks are allocated when the engine is built, so what a step can run out of is its
activations (and what the caching allocator has fragmented): they grow with the step's
tokens and rows. When the forward raises `torch.OutOfMemoryError` (`torch.cuda.
OutOfMemoryError` is the same class) the engine (`LLMEngine._out_of_memory`):

1. frees the caching allocator's cache (after the failed step's tensors went with its
   traceback), and reads the step in flight, if any (it ran: its tokens are good);
2. counts nothing of the failed step: its requests give back the KV blocks it had allocated
   them (the request table's `trim_blocks`) and stay as they were before it;
3. caps later steps (`StepCap`, the scheduler's `cap`) at half the tokens and half the rows
   of the one that failed; the scheduler preempts the running requests past the row cap
   (by recompute, as for a KV-block shortage), and the engine reads each step before the
   next one while a cap holds (no overlap: nothing preempted holds a pending token).

After `RECOVER_STEPS` steps that fit, the cap doubles; it goes once it reaches the
configured limits. Only when a step of one request and one token does not fit does that
request fail (finish_reason "error", a message naming memory); the others go on. A
tensor-parallel instance's step is not retried (its shards would be left mid-step): there
the error marks the engine's forward broken and ends the leader's worker
(worker/serving.py); the cluster rebuilds the whole group, and the router runs the step's
requests again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

RECOVER_STEPS = 16  # steps that fit under a cap before it doubles


@dataclass(frozen=True)
class StepCap:
    """The most tokens and rows (requests) a step may have after running out of memory."""

    tokens: int
    seqs: int


class Capped(Protocol):
    """What holds the cap and reads it when it schedules (the engine's Scheduler)."""

    cap: StepCap | None


class MemoryBackoff:
    """The engine's out-of-memory cap and its counters. The cap it sets is the scheduler's
    (`Scheduler.cap`, read by `schedule`); `cap` here reads it back."""

    def __init__(self, scheduler: Capped, max_tokens: int, max_seqs: int) -> None:
        self._scheduler = scheduler
        self.max_tokens = max_tokens
        self.max_seqs = max_seqs
        self.retries = 0  # steps that ran out of memory and were retried smaller
        self.failures = 0  # requests failed because a step of them alone did not fit
        self._fitted = 0  # steps that ran under the current cap

    @property
    def cap(self) -> StepCap | None:
        return self._scheduler.cap

    def _set(self, cap: StepCap | None) -> None:
        self._scheduler.cap = cap
        self._fitted = 0

    def shrink(self, tokens: int, rows: int) -> bool:
        """A step of `tokens` tokens in `rows` rows ran out of memory: cap the next ones at
        half of it. False, and nothing changes, when it was already the smallest step (one
        token of one request): that request cannot run here."""
        if tokens <= 1 and rows <= 1:
            return False
        self.retries += 1
        self._set(StepCap(max(1, tokens // 2), max(1, rows // 2)))
        return True

    def fitted(self) -> None:
        """A step ran: under a cap, every RECOVER_STEPS such steps double it (it goes once
        it reaches the configured limits)."""
        cap = self.cap
        if cap is None:
            return
        self._fitted += 1
        if self._fitted < RECOVER_STEPS:
            return
        tokens, seqs = min(2 * cap.tokens, self.max_tokens), min(2 * cap.seqs, self.max_seqs)
        self._set(None if (tokens, seqs) == (self.max_tokens, self.max_seqs) else StepCap(tokens, seqs))


def free_cached_memory(device: torch.device) -> None:
    """Give the caching allocator's unused blocks back to the device (CUDA; a no-op else).
    (torch is imported here: the scheduler imports this module, and the simulator runs the
    scheduler without torch.)"""
    if device.type == "cuda":
        import torch

        torch.cuda.empty_cache()


def oom_error(err: BaseException) -> str:
    """The error a request that cannot run alone fails with (torch's first line kept)."""
    text = str(err).strip()
    line = text.splitlines()[0] if text else type(err).__name__
    line = line if len(line) <= 160 else line[:157] + "..."
    return f"out of device memory: a step of this request alone (one token) does not fit ({line})"
