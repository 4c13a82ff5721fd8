"""StepWork: what one engine step computed, in the terms a step-time profile speaks
(control/costmodel.py): prompt tokens through the whole model, decode rows and their
contexts, and prompt tokens through only some of the layers (a live target's layer ranges,
a relayed prompt's remaining layers). The engine fills one per step; the serving loop reads
it to pace the step (worker/pacing.py) and to tally where its time goes by kind of step
(`StepTally`: decode steps that replayed a CUDA graph or ran eagerly, mixed prefill and
decode steps, prefill-only and live steps, and how many of each overlapped)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepWork:
    prompt_tokens: int = 0  # tokens run through every layer (prefill chunks, recomputes)
    decode_contexts: list[int] = field(default_factory=list)  # one per decode row: its context
    partial: list[tuple[int, float]] = field(default_factory=list)  # (tokens, share of the layers)
    graph: bool = False  # the forward replayed a captured CUDA graph
    overlapped: bool = False  # launched before the step before it was read (engine/overlap.py)
    chunks: int = 0  # prompt chunks among prompt_tokens
    prefixed_chunks: int = 0  # of those, the ones continuing a computed prefix
    running: int = 0  # requests in the running batch after scheduling (step trace)
    waiting: int = 0  # requests left waiting after scheduling (step trace)
    oom: bool = False  # the forward ran out of device memory: nothing computed (engine/oom.py)

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

    @property
    def kind(self) -> str:
        """What the step was, for `StepTally`: one of STEP_KINDS."""
        if self.partial:
            return "live"
        how = "graph" if self.graph else "eager"  # (replayed CUDA graphs, whole or piecewise)
        if self.prompt_tokens and self.decode_contexts:
            return f"mixed_{how}"
        if self.prompt_tokens:
            return f"prefill_{how}"
        if self.decode_contexts:
            return f"decode_{how}"
        return "none"


STEP_KINDS = (
    "decode_graph",
    "decode_eager",
    "mixed_graph",
    "mixed_eager",
    "prefill_graph",
    "prefill_eager",
    "live",
    "none",
)


@dataclass
class KindTally:
    steps: int = 0
    seconds: float = 0.0
    overlapped: int = 0
    tokens: int = 0  # prompt tokens plus decode rows


@dataclass
class StepTally:
    """Engine steps by kind over a worker's life (or a bench's run): how many, the seconds
    spent inside them, how many overlapped, and the tokens they computed."""

    kinds: dict[str, KindTally] = field(default_factory=lambda: {k: KindTally() for k in STEP_KINDS})

    def add(self, work: StepWork, seconds: float) -> None:
        t = self.kinds[work.kind]
        t.steps += 1
        t.seconds += seconds
        t.overlapped += work.overlapped
        t.tokens += work.prompt_tokens + work.decode_batch


def kinds_between(before: StepTally, after: StepTally) -> dict[str, dict[str, float]]:
    """Per kind of step that ran between two tallies: steps, ms a step, the share that
    overlapped, tokens a step (for benches: where a run's step time went)."""
    out = {}
    for kind, a in after.kinds.items():
        b = before.kinds[kind]
        n = a.steps - b.steps
        if n <= 0:
            continue
        out[kind] = {
            "steps": n,
            "ms_per_step": round(1000 * (a.seconds - b.seconds) / n, 3),
            "overlapped_share": round((a.overlapped - b.overlapped) / n, 3),
            "tokens_per_step": round((a.tokens - b.tokens) / n, 1),
        }
    return out
