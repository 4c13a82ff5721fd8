"""StepWork: what one engine step computed, in the terms a step-time profile speaks
(control/costmodel.py): prompt tokens through the whole model, decode rows and their
contexts, and prompt tokens through only some of the layers (a live target's layer ranges,
a relayed prompt's remaining layers). The engine fills one per step; the serving loop reads
it to pace the step (worker/pacing.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepWork:
    prompt_tokens: int = 0  # tokens run through every layer (prefill chunks, recomputes)
    decode_contexts: list[int] = field(default_factory=list)  # one per decode row: its context
    partial: list[tuple[int, float]] = field(default_factory=list)  # (tokens, share of the layers)

    @property
    def decode_batch(self) -> int:
        return len(self.decode_contexts)

    @property
    def mean_context(self) -> float:
        c = self.decode_contexts
        return sum(c) / len(c) if c else 0.0

    @property
    def is_empty(self) -> bool:
        return not (self.prompt_tokens or self.decode_contexts or self.partial)
