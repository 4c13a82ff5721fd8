"""Command-line values of `blitzscale replay`, checked into one typed record.

argparse keeps every value as the string the user typed and this module converts them, so
a bad value is reported in one line that names the flag and the value, the same way
whether the parser is ours or the main CLI's.
"""

import argparse
import math
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from blitzscale.client.protocols import PROTOCOLS
from blitzscale.client.traces import FORMATS, MOONCAKE_BLOCK_TOKENS

API_KEY_ENV = "BLITZSCALE_API_KEY"


class UsageError(ValueError):
    """A command-line value that cannot be used; the message is the whole one-line error."""


@dataclass(frozen=True)
class ReplayOptions:
    """Everything one replay needs; times in seconds (the CLI takes SLOs in ms)."""

    url: str
    out: Path
    trace: Path | None
    fmt: str | None
    duration_s: float | None
    time_scale: float
    rate_scale: float
    max_input: int | None
    max_output: int | None
    protocol: str
    slo_ttft_s: float | None
    slo_tbt_s: float | None
    gamma: tuple[float, float] | None
    seed: int
    input_len: int
    output_len: int
    model: str | None
    api_key: str | None
    timeout_s: float
    skip_failed: bool
    show_progress: bool
    token_ids: bool
    hash_block_tokens: int

    def to_json(self) -> dict:
        """The options as recorded next to the results; the API key is never written out."""
        out = {k: str(v) if isinstance(v, Path) else v for k, v in self.__dict__.items()}
        out["api_key"] = "***" if self.api_key else None
        return out


def _number(value: str | None, flag: str, *, integer: bool = False) -> float | None:
    """A positive finite number (an integer >= 1 when `integer`), or None if the flag is absent."""
    if value is None:
        return None
    kind = "an integer >= 1" if integer else "a number > 0"
    try:
        number = int(value) if integer else float(value)
    except ValueError:
        raise UsageError(f"{flag} expects {kind}, got {value!r}") from None
    if not (number > 0 and math.isfinite(number)):
        raise UsageError(f"{flag} expects {kind}, got {value!r}")
    return number


def _int(value: str | None, flag: str) -> int | None:
    number = _number(value, flag, integer=True)
    return None if number is None else int(number)


def _gamma(value: str | None) -> tuple[float, float] | None:
    """`RATE,CV`: Gamma arrivals with RATE req/s and inter-arrival CV."""
    if value is None:
        return None
    bad = UsageError(f"--gamma expects RATE,CV, got {value!r}")
    parts = value.split(",")
    if len(parts) != 2:
        raise bad
    try:
        rate, cv = float(parts[0]), float(parts[1])
    except ValueError:
        raise bad from None
    if not (rate > 0 and cv >= 0 and math.isfinite(rate) and math.isfinite(cv)):
        raise UsageError(f"--gamma expects RATE > 0 and CV >= 0, got {value!r}")
    return rate, cv


def _choice(value: str | None, flag: str, choices: tuple[str, ...]) -> str | None:
    if value is not None and value not in choices:
        raise UsageError(f"{flag} expects one of {', '.join(choices)}, got {value!r}")
    return value


def options_from_args(args: argparse.Namespace) -> ReplayOptions:
    """Check and convert; raises UsageError naming the first bad flag and value."""
    if not args.url.startswith(("http://", "https://")):
        raise UsageError(f"--url expects http://HOST:PORT or https://..., got {args.url!r}")
    try:
        parsed = urlsplit(args.url)
        port = parsed.port  # (ValueError past 65535)
    except ValueError as e:
        raise UsageError(f"--url {args.url!r}: {e}") from None
    if not parsed.hostname or port == 0:
        raise UsageError(
            f"--url expects http://HOST:PORT with a host and a port in [1, 65535], got {args.url!r}"
        )
    fmt = _choice(args.format, "--format", FORMATS)
    trace = Path(args.trace) if args.trace else None
    if trace is not None and not trace.is_file():
        raise UsageError(f"--trace: no such file {args.trace!r}")
    if trace is not None and fmt is None:
        raise UsageError(f"--format is required with --trace ({', '.join(FORMATS)})")
    gamma = _gamma(args.gamma)
    if gamma is None and trace is None:
        raise UsageError("give --trace PATH --format FMT, or --gamma RATE,CV --duration S")
    duration = _number(args.duration, "--duration")
    if gamma is not None and duration is None:
        raise UsageError("--gamma needs --duration S (how long to generate arrivals)")
    time_scale = _number(args.time_scale, "--time-scale") or 1.0
    rate_scale = _number(args.rate_scale, "--rate-scale") or 1.0
    if gamma is not None and (time_scale != 1.0 or rate_scale != 1.0):
        raise UsageError("--time-scale and --rate-scale do not apply to --gamma arrivals; change RATE")
    misplaced = {  # flags that would be silently ignored with this trace
        "--skip-failed": bool(args.skip_failed) and fmt != "burstgpt",
        "--hash-block-tokens": args.hash_block_tokens is not None and fmt != "mooncake",
        "--input-len": args.input_len is not None and trace is not None,
        "--output-len": args.output_len is not None and trace is not None,
    }
    if wrong := [flag for flag, bad in misplaced.items() if bad]:
        where = {"--skip-failed": "--format burstgpt", "--hash-block-tokens": "--format mooncake"}
        raise UsageError(
            f"{wrong[0]} applies only to {where.get(wrong[0], '--gamma arrivals without --trace')}"
        )
    protocol = _choice(args.protocol, "--protocol", PROTOCOLS) or "openai"
    if args.token_ids and protocol != "openai":
        raise UsageError(f"--token-ids needs --protocol openai, got {protocol!r}")
    slo_ttft_ms = _number(args.slo_ttft, "--slo-ttft")
    slo_tbt_ms = _number(args.slo_tbt, "--slo-tbt")
    return ReplayOptions(
        url=args.url.rstrip("/"),
        out=Path(args.out),
        trace=trace,
        fmt=fmt,
        duration_s=duration,
        time_scale=time_scale,
        rate_scale=rate_scale,
        max_input=_int(args.max_input, "--max-input"),
        max_output=_int(args.max_output, "--max-output"),
        protocol=protocol,
        slo_ttft_s=None if slo_ttft_ms is None else slo_ttft_ms / 1000.0,
        slo_tbt_s=None if slo_tbt_ms is None else slo_tbt_ms / 1000.0,
        gamma=gamma,
        seed=_seed(args.seed),
        input_len=_int(args.input_len, "--input-len") or 512,
        output_len=_int(args.output_len, "--output-len") or 128,
        model=args.model,
        api_key=args.api_key or os.environ.get(API_KEY_ENV),
        timeout_s=_number(args.timeout, "--timeout") or 300.0,
        skip_failed=bool(args.skip_failed),
        show_progress=not args.no_progress,
        token_ids=bool(args.token_ids),
        hash_block_tokens=_int(args.hash_block_tokens, "--hash-block-tokens") or MOONCAKE_BLOCK_TOKENS,
    )


def _seed(value: str) -> int:
    try:
        seed = int(value)
    except ValueError:
        raise UsageError(f"--seed expects an integer, got {value!r}") from None
    if not 0 <= seed < 2**32:  # (numpy's generators take no other)
        raise UsageError(f"--seed must be in [0, 2^32), got {seed}")
    return seed
