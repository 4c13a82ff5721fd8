"""What one replayed request measured, and its JSON-lines codec.

The replay writes these, the summary and report read them back: one typed record keeps the
field names of `requests.jsonl` in a single place. Times are seconds; `send_s` counts from
the start of the replay, the others from the moment the request was sent.
"""

import json
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from blitzscale.errors import InvalidRequestError

_TBT_QS = (90, 95, 99)  # the TBT percentiles a stored record carries

STATUS_OK = "ok"
STATUS_ERROR = "error"


@dataclass(frozen=True)
class TtftParts:
    """Where a request's time to first token went (simulated runs; seconds):
    - `router_queue_s`: in the router's queue, before any instance took it (less the
      load wait there);
    - `engine_queue_s`: on an instance (or moving between two), before a step computed any
      of its prompt;
    - `load_wait_s`: waiting for weights: in the router's queue while the instance that
      took it was still loading, and on a live target while its next layers had not landed;
    - `relay_s`: its hidden states crossing from a live target to the partner;
    - `compute_s`: the rest: the steps that computed its prompt, the others' steps between
      its chunks or layer stages, a live task parked for its partner, and the partner's run
      of the layers it relayed."""

    router_queue_s: float
    engine_queue_s: float
    load_wait_s: float
    relay_s: float
    compute_s: float


@dataclass(frozen=True)
class RequestRecord:
    """One request's outcome. Latencies are None when the request failed before producing them."""

    index: int
    scheduled_s: float
    send_s: float
    input_tokens: int
    requested_output_tokens: int
    output_tokens: int
    status: str
    error: str | None = None
    ttft_s: float | None = None
    tbts_s: tuple[float, ...] = ()
    e2e_s: float | None = None
    queue_s: float | None = None
    inference_s: float | None = None
    ttft_parts: TtftParts | None = None  # simulated runs only

    @property
    def is_ok(self) -> bool:
        return self.status == STATUS_OK

    @property
    def end_s(self) -> float | None:
        """When the last byte arrived, on the replay clock."""
        return None if self.e2e_s is None else self.send_s + self.e2e_s

    @property
    def tbt_max_s(self) -> float | None:
        return max(self.tbts_s) if self.tbts_s else None

    @property
    def tbt_mean_s(self) -> float | None:
        return float(np.mean(self.tbts_s)) if self.tbts_s else None

    def tbt_percentile_s(self, q: float) -> float | None:
        return float(np.percentile(self.tbts_s, q)) if self.tbts_s else None

    def to_json(self) -> dict:
        """The stored fields plus TBT max/mean/p90/p95/p99, so a reader needs no recomputation."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}  # (flat: asdict deep-copies)
        out["tbts_s"] = list(self.tbts_s)
        if self.ttft_parts is not None:
            out["ttft_parts"] = {f.name: getattr(self.ttft_parts, f.name) for f in fields(TtftParts)}
        out["tbt_max_s"] = self.tbt_max_s
        out["tbt_mean_s"] = self.tbt_mean_s
        # one percentile call for the three (a call costs ~0.1 ms, whatever the count)
        pcts = np.percentile(self.tbts_s, _TBT_QS).tolist() if self.tbts_s else [None] * len(_TBT_QS)
        for q, v in zip(_TBT_QS, pcts, strict=True):
            out[f"tbt_p{q}_s"] = v
        return out

    @classmethod
    def from_json(cls, obj: dict) -> "RequestRecord":
        """Inverse of to_json; derived keys are ignored."""
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in obj.items() if k in known}
        kwargs["tbts_s"] = tuple(kwargs.get("tbts_s", ()))
        if kwargs.get("ttft_parts") is not None:
            kwargs["ttft_parts"] = TtftParts(**kwargs["ttft_parts"])
        return cls(**kwargs)


def write_records(path: Path, records: Iterable[RequestRecord]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record.to_json()) + "\n")


def read_records(path: Path) -> list[RequestRecord]:
    """A run's `requests.jsonl`; InvalidRequestError naming the file and line it cannot read."""
    out: list[RequestRecord] = []
    line = 0
    try:
        with path.open(encoding="utf-8") as f:
            for text in f:
                line += 1
                if text.strip():
                    out.append(RequestRecord.from_json(json.loads(text)))
    except UnicodeDecodeError as e:
        raise InvalidRequestError(f"{path}: not UTF-8 text ({e.reason})") from None
    except (ValueError, TypeError, KeyError, AttributeError) as e:  # not JSON, or not a record
        raise InvalidRequestError(f"{path} line {line}: not a request record ({e})") from None
    return out
