"""The fixed request mixes `bench serve` drives, and what each gives, as typed results.

- closed loop: `streams` clients, each sending its next prompt as soon as its last answer
  ended; output tokens a second inside a measured window (after a warm-up);
- burst: `requests` long prompts at once, one token each: how many were refused, when the
  last was answered;
- one at a time: the first token of a long prompt, and a lone stream's token interval.

The same mixes run through the HTTP API (bench/serve_load.py) and through the engine alone
(bench/engine_load.py); `ratio` divides the served figure by the engine's.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Mix:
    streams: tuple[int, ...] = (64, 256)
    prompt_len: int = 512
    max_tokens: int = 256
    window_s: float = 20.0  # measured part of each closed loop
    warmup_s: float = 10.0  # its unmeasured start (the staggered first requests, then steady)
    burst: int = 128
    burst_len: int = 2048
    single_len: int = 2048
    single_runs: int = 3
    stream_tokens: int = 128  # the lone stream's output tokens

    def __post_init__(self) -> None:
        for name in ("prompt_len", "max_tokens", "burst", "burst_len", "single_len", "single_runs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.streams or min(self.streams) < 1:
            raise ValueError(f"streams must be positive counts, got {list(self.streams)}")
        if self.window_s <= 0 or self.warmup_s < 0 or self.stream_tokens < 2:
            raise ValueError("window_s must be > 0, warmup_s >= 0 and stream_tokens >= 2")

    def first_tokens(self, stream: int, streams: int) -> int:
        """Output tokens of a closed-loop stream's first request: staggered from 1 to
        `max_tokens` over the streams, so that their requests end evenly spread in time,
        not all in the same step (streams started together would otherwise stay in
        lockstep: every request ending at once, then a wave of prompts, and a 20 s window
        would see a phase-dependent number of waves). Every later request asks for
        `max_tokens`."""
        return 1 + (stream * self.max_tokens) // streams


@dataclass(frozen=True)
class ClosedLoop:
    streams: int
    output_tokens_per_s: float
    requests_done: int
    errors: int


@dataclass(frozen=True)
class Burst:
    requests: int
    refused: int  # HTTP 429 (the engine alone refuses nothing)
    errors: int  # any other failure
    last_answer_s: float  # from the first send to the last answer
    ttft_p50_s: float

    @staticmethod
    def of(requests: int, answered_s: list[float], refused: int) -> Burst:
        """`answered_s`: when each answered request had its answer, from the first send."""
        return Burst(
            requests=requests,
            refused=refused,
            errors=requests - len(answered_s) - refused,
            last_answer_s=round(max(answered_s), 4) if answered_s else float("nan"),
            ttft_p50_s=round(median(answered_s), 4),
        )


@dataclass(frozen=True)
class Single:
    prompt_len: int
    ttft_s: float  # median over the runs
    token_interval_s: float  # a lone stream's mean time between tokens


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def ratio(served: float, alone: float) -> float:
    return round(served / alone, 3) if alone else float("nan")


def compare(served: object, alone: object) -> dict[str, float]:
    """Each numeric field's served / engine-alone ratio (`bench serve`'s `ratio`)."""
    out = {}
    for name, value in vars(served).items():
        other = getattr(alone, name)
        if isinstance(value, float) and isinstance(other, float):
            out[name] = ratio(value, other)
    return out
