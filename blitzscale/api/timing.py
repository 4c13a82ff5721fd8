"""When a request's outputs arrived, and the TGI timing headers derived from that.

All times are `time.perf_counter()` seconds measured at the API: `arrival` is when the route
handler got the parsed request, so validation and tokenization count as queueing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from blitzscale.core.outputs import RequestOutput


@dataclass
class Timing:
    """Filled by the one task that reads a request's outputs (`Generation`); read by others."""

    arrival: float
    first_output: float | None = None
    first_token: float | None = None
    finished: float | None = None
    num_tokens: int = 0
    gaps: list[float] = field(default_factory=list)  # seconds between consecutive tokens
    backend_queue_s: float | None = None  # from the backend's optional hook, if it has one
    _last_token: float | None = None

    def record(self, out: RequestOutput, now: float) -> list[float]:
        """Note one output received at `now`; returns the new token gaps (for the TBT metric).

        An output holding k tokens shares the time since the previous token evenly among
        them; the first token of a request has no gap (it is the TTFT instead).
        """
        if self.first_output is None:
            self.first_output = now
        if out.finished:
            self.finished = now
        if out.restarted:  # it runs again from its prompt: the tokens so far are forgotten
            self.num_tokens = 0
        k = len(out.new_token_ids)
        if k == 0:
            return []
        self.num_tokens += k
        if self._last_token is None:
            self.first_token = now
            new = [0.0] * (k - 1)
        else:
            new = [(now - self._last_token) / k] * k
        self._last_token = now
        self.gaps.extend(new)
        return new

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def queue_s(self) -> float | None:
        """The backend's own figure when it gives one, else arrival to first output (an upper
        bound: it includes the prefill of the prompt)."""
        if self.backend_queue_s is not None:
            return self.backend_queue_s
        return None if self.first_output is None else self.first_output - self.arrival

    def tgi_timings_ms(self) -> dict[str, int]:
        """Every timing known so far, in integer milliseconds as TGI sends them; keys are the
        header names without `x-` and with `_` (so they can also go into a JSON object)."""
        out: dict[str, int] = {"output_length": self.num_tokens}
        queue = self.queue_s
        if queue is not None:
            out["queue_time"] = _ms(queue)
        if self.ttft_s is not None:
            out["first_token_time"] = _ms(self.ttft_s)
        if self.finished is not None and queue is not None:
            total = self.finished - self.arrival
            out["total_time"] = _ms(total)
            out["inference_time"] = _ms(max(total - queue, 0.0))
            out["max_time_between_tokens"] = _ms(max(self.gaps, default=0.0))
            out["avg_time_between_tokens"] = _ms(sum(self.gaps) / len(self.gaps) if self.gaps else 0.0)
            out["p99_time_between_tokens"] = _ms(percentile(self.gaps, 99))
        return out

    def tgi_headers(self, request_id: str) -> dict[str, str]:
        headers = {f"x-{k.replace('_', '-')}": str(v) for k, v in self.tgi_timings_ms().items()}
        if self.finished is None:  # a stream's headers go out before its length is known
            headers.pop("x-output-length", None)
        headers["x-request-id"] = request_id
        return headers


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (a value that occurred, not an interpolation); 0 if empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(math.ceil(pct / 100 * len(ordered)), 1)
    return ordered[rank - 1]


def _ms(seconds: float) -> int:
    return round(seconds * 1000)
