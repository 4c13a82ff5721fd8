"""The HTTP edge's own Prometheus metrics: requests by endpoint and status, TTFT and TBT.

Registered in a registry the caller passes (the router registers its cluster metrics in the
same one, so one `/metrics` scrape shows both). Nothing here is global: every app builds its
own `ApiMetrics`, so tests can build several apps in one process without name clashes.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

# Seconds. TTFT spans queueing during a scale-up (seconds) down to a warm prefill (ms).
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Seconds. One decode step of a small model is ~1 ms on a GPU; a stalled instance is seconds.
TBT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5)


class ApiMetrics:
    """Counters and histograms the API layer owns; `registry` is where they are exposed."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests_total = Counter(
            "blitzscale_requests",  # prometheus_client appends `_total` to counters
            "HTTP requests answered by the API, by endpoint and HTTP status",
            ("endpoint", "status"),
            registry=registry,
        )
        self.ttft_seconds = Histogram(
            "blitzscale_ttft_seconds",
            "Time from a request's arrival at the API to its first generated token",
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.tbt_seconds = Histogram(
            "blitzscale_tbt_seconds",
            "Time between consecutive generated tokens of a request, as seen by the API",
            buckets=TBT_BUCKETS,
            registry=registry,
        )

    def count_request(self, endpoint: str, status: int) -> None:
        self.requests_total.labels(endpoint=endpoint, status=str(status)).inc()

    def observe_ttft(self, seconds: float) -> None:
        self.ttft_seconds.observe(seconds)

    def observe_tbt(self, seconds: float) -> None:
        self.tbt_seconds.observe(seconds)
