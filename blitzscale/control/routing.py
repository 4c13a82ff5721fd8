"""Where a prompt finishes first, when a live target is among the places it could go.

A live target takes prompts once its first layers have landed, but it cannot finish one
alone before its last layer lands; its partner (the instance it loads beside, which takes
no prompt from the queue meanwhile) finishes the target's tasks when it has nothing of its
own (relays), and may partner several targets at once. So a loading target is not an
empty instance: a prompt sent there finishes at about the later of its last layer's arrival
and the work queued ahead of it, or sooner if the partner's pipeline (its own prompts and
all its targets') drains first. A prompt waits in the queue when a full instance would
still finish it sooner than any instance with room. A pure function over a snapshot of the
candidates, shared by the server's router and the simulator's (which runs the same one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Option:
    """One instance a prompt could go to."""

    rank: int
    outstanding_tokens: int  # prompt tokens dispatched there and not yet prefilled
    has_room: bool  # it may take the prompt now (its token budget and batch)
    loaded_in_s: float = 0.0  # a loading live target: seconds until its last layer lands
    pipeline_tokens: int | None = None  # a live target's partner: its and all its targets' tokens
    cached_tokens: int = 0  # of the prompt, what its prefix cache likely holds (work not done)


def finish_s(o: Option, tokens: int, rate: float) -> float:
    """Seconds until a prompt of `tokens` sent to `o` now would be prefilled, at `rate`
    prompt tokens a second (one instance's); the tokens `o` likely has cached are not
    prefilled again there (a live target's partner pipeline is timed on the whole prompt:
    the partner runs its share of the layers for every token)."""
    alone = max(o.loaded_in_s, (o.outstanding_tokens + max(0, tokens - o.cached_tokens)) / rate)
    if o.pipeline_tokens is None:
        return alone
    return min(alone, (o.pipeline_tokens + tokens) / rate)


def finish_first(options: Sequence[Option], tokens: int, rate: float) -> int | None:
    """The rank, among the options with room, where the prompt finishes first (ties: the
    fewest tokens outstanding); None when none has room or an option without room would
    finish it sooner (the prompt waits for it in the queue)."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    best = min(
        (o for o in options if o.has_room),
        key=lambda o: (finish_s(o, tokens, rate), o.outstanding_tokens),
        default=None,
    )
    if best is None:
        return None
    soonest_full = min((finish_s(o, tokens, rate) for o in options if not o.has_room), default=float("inf"))
    return best.rank if finish_s(best, tokens, rate) <= soonest_full else None
