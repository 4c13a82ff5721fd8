"""What storing one replayed request costs (`RequestRecord.to_json`, for every line of a
run's `requests.jsonl`: replays, simulations, batch runs), per call on one core, against the
form before (a deep `dataclasses.asdict` and one `np.percentile` call per TBT percentile),
and that both give the same values (a request of 49 TBTs, and 300 random ones).

Run (repo root): `.venv/bin/python docs/results/record_to_json_cost.py`. Prints JSON.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def before(r: object) -> dict:
    from blitzscale.client.record import RequestRecord

    assert isinstance(r, RequestRecord)
    out = dataclasses.asdict(r)
    out["tbts_s"] = list(r.tbts_s)
    out["tbt_max_s"] = r.tbt_max_s
    out["tbt_mean_s"] = r.tbt_mean_s
    for q in (90, 95, 99):
        out[f"tbt_p{q}_s"] = r.tbt_percentile_s(q)
    return out


def record(tbts: tuple[float, ...]) -> object:
    from blitzscale.client.record import RequestRecord

    return RequestRecord(
        index=1, scheduled_s=0.1, send_s=0.1, input_tokens=100, requested_output_tokens=50,
        output_tokens=len(tbts) + 1, status="ok", error=None, ttft_s=0.2, tbts_s=tbts, e2e_s=1.0,
        queue_s=0.0, inference_s=1.0,
    )  # fmt: skip


def main() -> None:
    rng = random.Random(0)
    same = all(
        before(r) == r.to_json()  # type: ignore[attr-defined]
        for r in (record(tuple(rng.random() for _ in range(rng.randint(0, 60)))) for _ in range(300))
    )
    r = record(tuple(rng.random() for _ in range(49)))
    n = 2000
    print(
        json.dumps(
            {
                "same_values": same,
                "before_us": round(timeit.timeit(lambda: before(r), number=n) / n * 1e6, 1),
                "now_us": round(timeit.timeit(r.to_json, number=n) / n * 1e6, 1),  # type: ignore[attr-defined]
            }
        )
    )


if __name__ == "__main__":
    main()
