"""Request traces: parse the public trace formats into one request type, then shape them.

Every parser returns `TraceRequest`s sorted by arrival, with `arrival_s` counted from the
earliest request, so a replay can start at once whatever epoch the file uses. A bad row
stops the load with a `TraceFormatError` naming file, line and problem: silently dropping
rows would change the load the experiment claims to have applied.
"""

import csv
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path

import numpy as np

from blitzscale.errors import BlitzScaleError, InvalidRequestError

FORMATS = ("azure", "burstgpt", "mooncake", "processed")
# The block size, in tokens, of the `hash_ids` of Mooncake's traces.
MOONCAKE_BLOCK_TOKENS = 512

# A parsed row: time (s, any origin), input and output tokens, prefix-block hashes.
_Row = tuple[float, int, int, tuple[int, ...]]


@dataclass(frozen=True)
class TraceRequest:
    """One request to replay: when it arrives (s after the first one) and its lengths in tokens."""

    arrival_s: float
    input_tokens: int
    output_tokens: int
    # Mooncake's prefix-block hashes (blocks of MOONCAKE_BLOCK_TOKENS): requests whose lists
    # share a leading run share that prefix of prompt. Empty for formats without them.
    hash_ids: tuple[int, ...] = ()


class TraceFormatError(BlitzScaleError, ValueError):
    """A trace row that cannot be read; the message reads `FILE line N: what was wrong`."""


def load_trace(path: str | Path, fmt: str, *, skip_failed: bool = False) -> list[TraceRequest]:
    """Parse `path` as `fmt` (one of FORMATS). `skip_failed` drops BurstGPT rows whose response
    has 0 tokens (failed requests upstream); other formats have no failed rows."""
    path = Path(path)
    readers = {
        "azure": _azure_rows,
        "burstgpt": lambda p: _burstgpt_rows(p, skip_failed),
        "mooncake": _mooncake_rows,
        "processed": _processed_rows,
    }
    if fmt not in readers:
        raise ValueError(f"unknown trace format {fmt!r}; expected one of {', '.join(FORMATS)}")
    try:
        return _rebase(readers[fmt](path))
    except UnicodeDecodeError as e:
        raise TraceFormatError(f"{path}: not UTF-8 text (byte {e.start} of a line: {e.reason})") from None


def _fail(path: Path, line: int, what: str) -> TraceFormatError:
    return TraceFormatError(f"{path} line {line}: {what}")


def _rebase(rows: list[_Row]) -> list[TraceRequest]:
    """Sort by time (stable: rows of one timestamp keep file order) and count arrivals from
    the earliest request."""
    rows.sort(key=lambda r: r[0])
    start = rows[0][0] if rows else 0.0
    return [TraceRequest(t - start, n_in, n_out, ids) for t, n_in, n_out, ids in rows]


def _count(text: str, name: str, path: Path, line: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise _fail(path, line, f"{name} must be an integer, got {text!r}") from None
    if value < 0:
        raise _fail(path, line, f"{name} must be >= 0, got {value}")
    return value


def _seconds(text: str, name: str, path: Path, line: int) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise _fail(path, line, f"{name} must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise _fail(path, line, f"{name} must be finite, got {text!r}")
    return value


def _csv_lines(path: Path) -> Iterator[tuple[int, list[str]]]:
    """Non-blank CSV rows with their 1-based line numbers (CRLF or LF)."""
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        try:
            for row in reader:
                if any(cell.strip() for cell in row):
                    yield reader.line_num, row
        except csv.Error as e:
            raise _fail(path, reader.line_num, f"bad CSV: {e}") from None


def _named_rows(path: Path, wanted: Sequence[str]) -> Iterator[tuple[int, list[str]]]:
    """Rows of a CSV with a header, reduced to the `wanted` columns in that order."""
    lines = _csv_lines(path)
    first = next(lines, None)
    if first is None:
        return
    line, header = first
    names = [h.strip() for h in header]
    missing = [w for w in wanted if w not in names]
    if missing:
        raise _fail(path, line, f"header lacks column(s) {', '.join(missing)}; found {', '.join(names)}")
    cols = [names.index(w) for w in wanted]
    for line, row in lines:
        if len(row) != len(names):
            raise _fail(path, line, f"expected {len(names)} columns, got {len(row)}")
        yield line, [row[c] for c in cols]


def _azure_time(text: str, path: Path, line: int) -> datetime:
    """Both Azure styles: 2023 `2023-11-16 18:17:03.9799600` (naive, read as UTC) and 2024
    `2024-05-10 00:00:00.009930+00:00`; ISO `...Z` (2025) also passes."""
    try:
        stamp = datetime.fromisoformat(text.strip())
    except ValueError:
        raise _fail(path, line, f"TIMESTAMP is not a date-time: {text!r}") from None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


def _azure_rows(path: Path) -> list[_Row]:
    rows: list[_Row] = []
    origin: datetime | None = None
    for line, (stamp, n_in, n_out) in _named_rows(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens")):
        when = _azure_time(stamp, path, line)
        origin = origin or when
        # Differences of datetimes keep microseconds exact; epoch floats would not.
        rows.append(
            (
                (when - origin).total_seconds(),
                _count(n_in, "ContextTokens", path, line),
                _count(n_out, "GeneratedTokens", path, line),
                (),
            )
        )
    return rows


def _burstgpt_rows(path: Path, skip_failed: bool) -> list[_Row]:
    """Columns found by name, so BurstGPT_1 and BurstGPT_3 (Session ID, Elapsed time) both load."""
    rows: list[_Row] = []
    for line, (stamp, n_in, n_out) in _named_rows(path, ("Timestamp", "Request tokens", "Response tokens")):
        output_tokens = _count(n_out, "Response tokens", path, line)
        if skip_failed and output_tokens == 0:
            continue
        rows.append(
            (
                _seconds(stamp, "Timestamp", path, line),
                _count(n_in, "Request tokens", path, line),
                output_tokens,
                (),
            )
        )
    return rows


def _processed_rows(path: Path) -> list[_Row]:
    """`timestamp_ms,prefill,decode` by position; a first row whose time is not a number is a header."""
    rows: list[_Row] = []
    for index, (line, row) in enumerate(_csv_lines(path)):
        if len(row) < 3:
            raise _fail(path, line, f"expected 3 columns timestamp_ms,prefill,decode, got {len(row)}")
        if index == 0 and not _is_number(row[0]):
            continue
        stamp_ms = _seconds(row[0], "timestamp_ms", path, line)
        rows.append(
            (
                stamp_ms / 1000.0,
                _count(row[1], "prefill", path, line),
                _count(row[2], "decode", path, line),
                (),
            )
        )
    return rows


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _mooncake_rows(path: Path) -> list[_Row]:
    """JSONL `{"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [n, ...]}`;
    `hash_ids` may be absent (no known shared prefix), other keys are ignored."""
    rows: list[_Row] = []
    with path.open(encoding="utf-8") as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise _fail(path, line, f"not JSON: {e.msg}") from None
            if not isinstance(obj, dict):
                raise _fail(path, line, f"expected a JSON object, got {type(obj).__name__}")
            stamp = _json_number(obj, "timestamp", path, line, (int, float))
            n_in = _json_number(obj, "input_length", path, line, (int,))
            n_out = _json_number(obj, "output_length", path, line, (int,))
            rows.append((stamp / 1000.0, int(n_in), int(n_out), _hash_ids(obj, path, line)))
    return rows


def _hash_ids(obj: dict, path: Path, line: int) -> tuple[int, ...]:
    """The row's `hash_ids`: a list of integers >= 0 (JSON booleans and floats are not ids)."""
    value = obj.get("hash_ids")
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _fail(path, line, f"hash_ids must be a list of integers >= 0, got {value!r}")
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise _fail(path, line, f"hash_ids[{i}] must be an integer >= 0, got {item!r}")
    return tuple(value)


def _json_number(obj: dict, key: str, path: Path, line: int, kinds: tuple[type, ...]) -> float:
    value = obj.get(key)
    if value is None:
        raise _fail(path, line, f"missing key {key!r}")
    if isinstance(value, bool) or not isinstance(value, kinds) or value < 0 or not math.isfinite(value):
        raise _fail(path, line, f"{key} must be a {'/'.join(k.__name__ for k in kinds)} >= 0, got {value!r}")
    return value


def gamma_arrivals(rate: float, cv: float, duration_s: float, seed: int = 0) -> list[float]:
    """Arrival times in [0, duration_s) with Gamma inter-arrival gaps of mean 1/rate and
    coefficient of variation cv (shape 1/cv^2, scale cv^2/rate): cv=1 is Poisson, cv>1 is
    burstier, cv=0 is evenly spaced. The first request arrives at 0, like a parsed trace."""
    if not rate > 0 or not math.isfinite(rate):
        raise ValueError(f"rate must be > 0 req/s, got {rate}")
    if not cv >= 0 or not math.isfinite(cv):
        raise ValueError(f"cv must be >= 0, got {cv}")
    if not duration_s > 0:
        raise ValueError(f"duration must be > 0 s, got {duration_s}")
    rng = np.random.default_rng(seed)
    chunk = int(rate * duration_s * 1.2) + 16
    times: list[float] = []
    now = 0.0
    while now < duration_s:
        gaps = np.full(chunk, 1.0 / rate) if cv == 0 else rng.gamma(1.0 / cv**2, cv**2 / rate, size=chunk)
        for gap in gaps:
            if now >= duration_s:
                break
            times.append(now)
            now += float(gap)
    return times


def with_lengths(
    arrivals: Sequence[float], lengths: Sequence[TraceRequest], input_len: int, output_len: int
) -> list[TraceRequest]:
    """Requests at synthetic `arrivals`; lengths (and prefix-block hashes) cycle through
    `lengths` (a trace) in order, or are the fixed input_len/output_len when no trace is given."""
    if not lengths:
        return [TraceRequest(t, input_len, output_len) for t in arrivals]
    return [replace(lengths[i % len(lengths)], arrival_s=t) for i, t in enumerate(arrivals)]


def scale_hash_blocks(requests: Sequence[TraceRequest], block_tokens: int) -> list[TraceRequest]:
    """Shrink (or grow) the prefix blocks of requests with `hash_ids` from Mooncake's
    MOONCAKE_BLOCK_TOKENS to `block_tokens`: each such input length becomes
    ceil(length * block_tokens / MOONCAKE_BLOCK_TOKENS), which keeps its number of blocks,
    so a trace's reuse structure fits a small model. Requests without hash_ids are unchanged."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    if block_tokens == MOONCAKE_BLOCK_TOKENS:
        return list(requests)
    return [
        replace(r, input_tokens=-(-r.input_tokens * block_tokens // MOONCAKE_BLOCK_TOKENS))
        if r.hash_ids
        else r
        for r in requests
    ]


MAX_REQUESTS = 20_000_000  # a shaped trace's bound (~5 GB of requests in memory)


def transform(
    requests: Sequence[TraceRequest],
    duration: float | None = None,
    time_scale: float = 1.0,
    rate_scale: float = 1.0,
    max_input: int | None = None,
    max_output: int | None = None,
) -> list[TraceRequest]:
    """Shape a trace for one replay, in this order:

    1. time_scale X divides every timestamp: X=2 replays the trace twice as fast (double
       rate, half the span, the same requests).
    2. duration keeps requests arriving before `duration` s of replay time (after step 1).
    3. rate_scale Y changes the number of requests but not the timeline: the rate becomes
       Y times the original while the span and the shape of bursts stay. Y<1 keeps an
       evenly spread fraction Y (request i is sent ceil((i+1)Y) - ceil(iY) times, 0 or 1,
       so Y=0.5 keeps every other request, starting with the first); Y>1 sends each request
       that many times at its own timestamp (Y=2: every request twice). Deterministic.
    4. max_input / max_output clamp the lengths (prompt truncation, shorter answers).
    """
    if not time_scale > 0:
        raise InvalidRequestError(f"time_scale must be > 0, got {time_scale}")
    if not rate_scale > 0:
        raise InvalidRequestError(f"rate_scale must be > 0, got {rate_scale}")
    if duration is not None and not duration > 0:
        raise InvalidRequestError(f"duration must be > 0 s, got {duration}")
    for name, limit in (("max_input", max_input), ("max_output", max_output)):
        if limit is not None and limit < 1:
            raise InvalidRequestError(f"{name} must be >= 1, got {limit}")
    scaled = [replace(r, arrival_s=r.arrival_s / time_scale) for r in requests]
    if duration is not None:
        scaled = [r for r in scaled if r.arrival_s < duration]
    ratio = Fraction(rate_scale).limit_denominator(1_000_000)
    total = math.ceil(len(scaled) * ratio)  # (the copies below sum to this)
    if total > MAX_REQUESTS:
        raise InvalidRequestError(
            f"rate_scale {rate_scale:g} makes {total:,} requests of {len(scaled):,}; at most "
            f"{MAX_REQUESTS:,} are replayed or simulated (a smaller rate_scale or a duration)"
        )
    out: list[TraceRequest] = []
    for i, r in enumerate(scaled):
        copies = math.ceil((i + 1) * ratio) - math.ceil(i * ratio)
        clamped = replace(
            r,
            input_tokens=min(r.input_tokens, max_input) if max_input else r.input_tokens,
            output_tokens=min(r.output_tokens, max_output) if max_output else r.output_tokens,
        )
        out.extend([clamped] * copies)
    return out
