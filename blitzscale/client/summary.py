"""Offline numbers of one replay: latency percentiles, SLO attainment, throughput, GPU time.

Pure functions over `RequestRecord`s so a summary can be recomputed from `requests.jsonl`
with other SLOs, and tested on hand-made records. The rules, exactly:

- Latency statistics use successful requests only. TTFT statistics take one value per
  request. TBT statistics pool every inter-token gap of every request (each token weighs
  the same, so long answers count more). Percentiles interpolate linearly (numpy default).
- A request meets the SLO when it succeeded, its TTFT <= the TTFT SLO and its mean TBT <=
  the TBT SLO (a request with one token has no TBT and passes that half). Attainment is
  the share of *all* requests meeting it: a failed request is a miss.
- An SLO not given follows the paper's rule: 5x the run's mean, where the TTFT mean is over
  successful requests and the TBT mean is the mean of their per-request mean TBTs (the same
  quantity each request is checked against).
- Throughput counts successful requests and their output tokens over the run span, from the
  first send to the last successful completion.
"""

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from blitzscale.client.record import RequestRecord

SLO_FACTOR = 5.0


@dataclass(frozen=True)
class Percentiles:
    """Mean and tail of one latency, in seconds; None when there was nothing to measure."""

    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None


@dataclass(frozen=True)
class Slo:
    """Thresholds in seconds and where each came from ("given" or "5x mean")."""

    ttft_s: float | None
    tbt_s: float | None
    ttft_rule: str
    tbt_rule: str


@dataclass(frozen=True)
class Summary:
    num_requests: int
    num_ok: int
    num_errors: int
    ttft_s: Percentiles
    tbt_s: Percentiles
    slo: Slo
    slo_attainment: float | None
    span_s: float
    requests_per_s: float
    output_tokens_per_s: float
    gpu_seconds: float | None = None

    def to_json(self) -> dict:
        return asdict(self)


def percentiles(values: Sequence[float]) -> Percentiles:
    if len(values) == 0:
        return Percentiles(None, None, None, None)
    p50, p90, p99 = (float(v) for v in np.percentile(values, [50, 90, 99]))
    return Percentiles(float(np.mean(values)), p50, p90, p99)


def ttft_values(records: Sequence[RequestRecord]) -> list[float]:
    return [r.ttft_s for r in records if r.is_ok and r.ttft_s is not None]


def tbt_values(records: Sequence[RequestRecord]) -> list[float]:
    """Every inter-token gap of every successful request, pooled."""
    return [gap for r in records if r.is_ok for gap in r.tbts_s]


def slo_thresholds(
    records: Sequence[RequestRecord], ttft_s: float | None = None, tbt_s: float | None = None
) -> Slo:
    """The given thresholds, each missing one replaced by 5x the run's mean (see module doc)."""
    ttfts = ttft_values(records)
    tbt_means = [m for r in records if r.is_ok and (m := r.tbt_mean_s) is not None]
    default_ttft = SLO_FACTOR * float(np.mean(ttfts)) if ttfts else None
    default_tbt = SLO_FACTOR * float(np.mean(tbt_means)) if tbt_means else None
    return Slo(
        ttft_s=ttft_s if ttft_s is not None else default_ttft,
        tbt_s=tbt_s if tbt_s is not None else default_tbt,
        ttft_rule="given" if ttft_s is not None else "5x mean",
        tbt_rule="given" if tbt_s is not None else "5x mean",
    )


def meets_slo(record: RequestRecord, slo: Slo) -> bool:
    if not record.is_ok or record.ttft_s is None:
        return False
    if slo.ttft_s is not None and record.ttft_s > slo.ttft_s:
        return False
    tbt = record.tbt_mean_s
    return tbt is None or slo.tbt_s is None or tbt <= slo.tbt_s


def slo_attainment(records: Sequence[RequestRecord], slo: Slo) -> float | None:
    """Share of all requests that met the SLO; None for an empty run."""
    if not records:
        return None
    return sum(meets_slo(r, slo) for r in records) / len(records)


def run_span(records: Sequence[RequestRecord]) -> float:
    """Seconds from the first send to the last successful completion (0 without one)."""
    ends = [end for r in records if r.is_ok and (end := r.end_s) is not None]
    if not ends:
        return 0.0
    return max(ends) - min(r.send_s for r in records)


def gpu_seconds(samples: Sequence[tuple[float, int]], gpus_per_instance: int = 1) -> float:
    """Integral of the instance count over time: each (time_s, count) sample holds until the
    next one (instances change in steps, so no interpolation); the last sample only closes
    the series. Pass a final sample at the end of the run to count up to it."""
    ordered = sorted(samples)
    area = sum(count * (t_next - t) for (t, count), (t_next, _) in itertools.pairwise(ordered))
    return float(area * gpus_per_instance)


def summarize(
    records: Sequence[RequestRecord],
    slo_ttft_s: float | None = None,
    slo_tbt_s: float | None = None,
    instance_samples: Sequence[tuple[float, int]] | None = None,
    gpus_per_instance: int = 1,
) -> Summary:
    ok = [r for r in records if r.is_ok]
    span = run_span(records)
    slo = slo_thresholds(records, slo_ttft_s, slo_tbt_s)
    return Summary(
        num_requests=len(records),
        num_ok=len(ok),
        num_errors=len(records) - len(ok),
        ttft_s=percentiles(ttft_values(records)),
        tbt_s=percentiles(tbt_values(records)),
        slo=slo,
        slo_attainment=slo_attainment(records, slo),
        span_s=span,
        requests_per_s=len(ok) / span if span > 0 else 0.0,
        output_tokens_per_s=sum(r.output_tokens for r in ok) / span if span > 0 else 0.0,
        gpu_seconds=gpu_seconds(instance_samples, gpus_per_instance) if instance_samples else None,
    )
