"""`blitzscale bench runs DIR...`: finished runs side by side, judged by one pair of SLOs.

A run folder is what `batch`, `demo`, `replay` or `simulate` wrote: its requests.jsonl. Each
run is judged by the same TTFT / TBT SLOs given here (a refused or failed request misses
them), so a live run and a simulated one compare alike whatever SLOs each was written with.
"Refused" counts the server's load shedding ("overloaded", HTTP 429); the served rate is the
prompt tokens of the requests that completed, over the time until the last one finished.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from blitzscale.client.record import RequestRecord, read_records
from blitzscale.client.summary import summarize
from blitzscale.errors import InvalidRequestError


def side(records: list[RequestRecord], ttft_slo_s: float, tbt_slo_s: float) -> dict[str, Any]:
    s = summarize(records, ttft_slo_s, tbt_slo_s)
    ok = [r for r in records if r.is_ok]
    refused = sum(1 for r in records if not r.is_ok and "overloaded" in (r.error or ""))
    end = max((r.end_s for r in ok if r.end_s is not None), default=0.0)
    return {
        "requests": s.num_requests,
        "ok": s.num_ok,
        "refused_overloaded": refused,
        "other_errors": s.num_errors - refused,
        "ttft_ms": {k: round(getattr(s.ttft_s, k) * 1000) for k in ("p50", "p90", "p99")},
        "tbt_ms": {k: round(getattr(s.tbt_s, k) * 1000, 1) for k in ("p50", "p99")},
        "slo_attainment": None if s.slo_attainment is None else round(s.slo_attainment, 3),
        "served_prompt_tokens_per_s": round(sum(r.input_tokens for r in ok) / end) if end > 0 else 0,
    }


def compare_runs(dirs: list[Path], ttft_slo_s: float, tbt_slo_s: float) -> dict[str, Any]:
    missing = [str(d) for d in dirs if not (d / "requests.jsonl").is_file()]
    if missing:
        raise InvalidRequestError(f"no requests.jsonl in {', '.join(missing)}")
    records = {str(d): read_records(d / "requests.jsonl") for d in dirs}
    empty = [d for d, r in records.items() if not r]
    if empty:
        raise InvalidRequestError(f"no requests in {', '.join(f'{d}/requests.jsonl' for d in empty)}")
    return {
        "slo": {"ttft_s": ttft_slo_s, "tbt_s": tbt_slo_s},
        "runs": {d: side(r, ttft_slo_s, tbt_slo_s) for d, r in records.items()},
    }
