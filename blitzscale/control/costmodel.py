"""Step-time profiles: how long our engine takes to prefill and to decode, measured on a
real machine (`blitzscale profile`) or derived from a measured one, interpolated here.

A profile is a JSON file:
- `prefill`: `tokens` -> `ms` for one prefill step of that many prompt tokens;
- `decode`: `batch` x `context` -> `ms` for one decode step of `batch` sequences whose
  mean context is `context` tokens;
- sizes: `weight_bytes`, `kv_bytes_per_token`, `device_memory_bytes` (what one GPU or CPU
  slot holds), `memory_utilization` (share of what is left after the weights for KV);
- `mixed_extra_ms` (optional, 0 if absent): what a step that prefills and decodes at once
  takes beyond a prefill of as many tokens (its decode rows counted as prompt tokens), as
  measured: a mixed step launches more kernels (the decode attention besides the prompt's)
  and, on a GPU whose eager steps are bound by the host's launches, pays for each;
- `derived_from` (optional): the measured profile it was scaled from and the factors
  (decode scales with memory bandwidth, prefill with the FLOP rate).
Between points the times are linear; beyond the last point they grow with the last slope.
"""

from __future__ import annotations

import bisect
import itertools
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from blitzscale.errors import BlitzScaleError

PROFILES_DIR = Path(__file__).resolve().parent.parent / "data" / "profiles"


class ProfileError(BlitzScaleError, ValueError):
    """A profile file that cannot be used (names the file and the problem)."""


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear through the points; the end segments extend beyond them (never
    below zero)."""
    if len(xs) == 1:
        return ys[0] * (x / xs[0] if xs[0] else 1.0)
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclass(frozen=True)
class Profile:
    name: str
    device: str
    weight_bytes: int
    kv_bytes_per_token: int
    device_memory_bytes: int
    prefill_tokens: tuple[int, ...]
    prefill_ms: tuple[float, ...]
    decode_batch: tuple[int, ...]
    decode_context: tuple[int, ...]
    decode_ms: tuple[tuple[float, ...], ...]  # [batch][context]
    memory_utilization: float = 0.9
    num_layers: int = 32
    derived_from: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    mixed_extra_ms: float = 0.0

    def __post_init__(self) -> None:
        def increasing(name: str, xs: tuple[int, ...]) -> None:
            if not xs or any(b <= a for a, b in itertools.pairwise(xs)):
                raise ProfileError(f"profile {self.name!r}: {name} must be increasing and non-empty")

        increasing("prefill.tokens", self.prefill_tokens)
        increasing("decode.batch", self.decode_batch)
        increasing("decode.context", self.decode_context)
        if len(self.prefill_ms) != len(self.prefill_tokens):
            raise ProfileError(f"profile {self.name!r}: prefill.ms needs one value per prefill.tokens")
        if len(self.decode_ms) != len(self.decode_batch) or any(
            len(row) != len(self.decode_context) for row in self.decode_ms
        ):
            raise ProfileError(f"profile {self.name!r}: decode.ms must be [batch][context]")
        if self.kv_tokens < 1:
            raise ProfileError(f"profile {self.name!r}: the weights leave no memory for KV")
        if not self.mixed_extra_ms >= 0:
            raise ProfileError(
                f"profile {self.name!r}: mixed_extra_ms must be >= 0, got {self.mixed_extra_ms}"
            )

    # --- times ----------------------------------------------------------------------------

    def prefill_s(self, tokens: int) -> float:
        return _interp(list(self.prefill_tokens), list(self.prefill_ms), tokens) / 1000

    def decode_s(self, batch: int, context: float) -> float:
        """One decode step of `batch` sequences at mean context `context`."""
        if batch <= 0:
            return 0.0
        ctx = list(self.decode_context)
        per_batch = [_interp(ctx, list(row), context) for row in self.decode_ms]
        return _interp(list(self.decode_batch), per_batch, batch) / 1000

    def prefill_rate(self, tokens: int | None = None) -> float:
        """Prompt tokens prefilled per second in steps of `tokens` (None: the largest
        measured step), the rate the planner and the router's budgets count in."""
        n = tokens or self.prefill_tokens[-1]
        return n / max(self.prefill_s(n), 1e-9)

    def prefill_tokens_in(self, seconds: float, step_tokens: int | None = None) -> int:
        """Prompt tokens one instance prefills in `seconds` (steps of `step_tokens`)."""
        return max(1, int(seconds * self.prefill_rate(step_tokens)))

    def summary(self) -> dict[str, Any]:
        """What `/health` and the start-up log show of it."""
        big = self.prefill_tokens[-1]
        return {
            "name": self.name,
            "device": self.device,
            "note": self.note,
            "prefill_ms": {str(n): round(1000 * self.prefill_s(n), 2) for n in self.prefill_tokens},
            "prefill_tokens_per_s": round(self.prefill_rate(big)),
            "decode_ms": {
                f"batch {b}": round(1000 * self.decode_s(b, self.decode_context[0]), 2)
                for b in self.decode_batch
            },
        }

    def check_fits(self, weight_bytes: int, kv_bytes_per_token: int, num_layers: int, where: str) -> None:
        """Refuse, naming both, a profile of another model shape than the one served."""
        mine = (self.weight_bytes, self.kv_bytes_per_token, self.num_layers)
        theirs = (weight_bytes, kv_bytes_per_token, num_layers)
        if mine != theirs:
            raise ProfileError(
                f"{where}: profile {self.name!r} is of another model (weight bytes, KV bytes a token, "
                f"layers: {mine}); the served model has {theirs}"
            )

    def check_device(self, device_name: str, where: str) -> None:
        """Refuse, naming both, a profile measured on another kind of device."""
        if _device_kind(self.device) != _device_kind(device_name):
            raise ProfileError(
                f"{where}: profile {self.name!r} was measured on {self.device!r}; the workers run on "
                f"{device_name!r}"
            )

    @property
    def hidden_bytes_per_token(self) -> int:
        """A token's residual stream (what a relay carries besides KV). Profiles do not
        record the hidden size; with grouped-query attention (4 query heads a KV head, as
        in Llama 3 8B and Mistral 24B) it is twice one layer's KV of a token."""
        return 2 * self.kv_bytes_per_token // self.num_layers

    @property
    def kv_tokens(self) -> int:
        """Tokens of KV one instance holds."""
        free = (self.device_memory_bytes - self.weight_bytes) * self.memory_utilization
        return int(free // self.kv_bytes_per_token)

    @property
    def engine_bytes(self) -> int:
        """What one engine alone on the device takes: its weights and its KV cache (the
        device's usable memory, which resident models share equally)."""
        return self.weight_bytes + self.kv_tokens * self.kv_bytes_per_token

    # --- files ----------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        return {
            "name": d["name"],
            "device": d["device"],
            "note": d["note"],
            "weight_bytes": d["weight_bytes"],
            "kv_bytes_per_token": d["kv_bytes_per_token"],
            "device_memory_bytes": d["device_memory_bytes"],
            "memory_utilization": d["memory_utilization"],
            "num_layers": d["num_layers"],
            "prefill": {"tokens": list(self.prefill_tokens), "ms": list(self.prefill_ms)},
            "decode": {
                "batch": list(self.decode_batch),
                "context": list(self.decode_context),
                "ms": [list(r) for r in self.decode_ms],
            },
            "mixed_extra_ms": d["mixed_extra_ms"],
            "derived_from": d["derived_from"],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any], where: str = "profile") -> Profile:
        try:
            return cls(
                name=str(d["name"]),
                device=str(d["device"]),
                note=str(d.get("note", "")),
                weight_bytes=int(d["weight_bytes"]),
                kv_bytes_per_token=int(d["kv_bytes_per_token"]),
                device_memory_bytes=int(d["device_memory_bytes"]),
                memory_utilization=float(d.get("memory_utilization", 0.9)),
                num_layers=int(d.get("num_layers", 32)),
                prefill_tokens=tuple(int(x) for x in d["prefill"]["tokens"]),
                prefill_ms=tuple(float(x) for x in d["prefill"]["ms"]),
                decode_batch=tuple(int(x) for x in d["decode"]["batch"]),
                decode_context=tuple(int(x) for x in d["decode"]["context"]),
                decode_ms=tuple(tuple(float(x) for x in row) for row in d["decode"]["ms"]),
                derived_from=dict(d.get("derived_from") or {}),
                mixed_extra_ms=float(d.get("mixed_extra_ms", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, ProfileError):
                raise
            raise ProfileError(f"{where}: not a step-time profile ({type(e).__name__}: {e})") from e

    def save(self, path: Path) -> None:
        """(its folder made if missing: `--out new/p.json` is checked, not made, up front)"""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")

    def scaled(self, name: str, weight_bytes: int, kv_bytes_per_token: int, num_layers: int) -> Profile:
        """An estimate for a model of another size on this device: every step takes as
        much longer as the weights are larger (decode reads them all, prefill's FLOPs grow
        with them). For models that were not measured themselves."""
        f = weight_bytes / self.weight_bytes
        return replace(
            self,
            name=name,
            note=f"scaled from {self.name!r} by its weight bytes (x{f:.3g})",
            weight_bytes=weight_bytes,
            kv_bytes_per_token=kv_bytes_per_token,
            num_layers=num_layers,
            prefill_ms=tuple(round(x * f, 4) for x in self.prefill_ms),
            decode_ms=tuple(tuple(round(x * f, 4) for x in row) for row in self.decode_ms),
            mixed_extra_ms=round(self.mixed_extra_ms * f, 4),
            derived_from={"profile": self.name, "weight_factor": f},
        )

    def derive(
        self, name: str, device: str, bandwidth_factor: float, flops_factor: float, memory_bytes: int
    ) -> Profile:
        """This profile on another device: decode steps (memory-bound) divided by the memory
        bandwidth ratio, prefill steps (compute-bound) by the FLOP-rate ratio."""
        return Profile(
            name=name,
            device=device,
            note=f"derived from {self.name!r} ({self.device})",
            weight_bytes=self.weight_bytes,
            kv_bytes_per_token=self.kv_bytes_per_token,
            device_memory_bytes=memory_bytes,
            memory_utilization=self.memory_utilization,
            num_layers=self.num_layers,
            prefill_tokens=self.prefill_tokens,
            prefill_ms=tuple(round(x / flops_factor, 4) for x in self.prefill_ms),
            decode_batch=self.decode_batch,
            decode_context=self.decode_context,
            decode_ms=tuple(tuple(round(x / bandwidth_factor, 4) for x in row) for row in self.decode_ms),
            mixed_extra_ms=round(self.mixed_extra_ms / flops_factor, 4),
            derived_from={
                "profile": self.name,
                "device": self.device,
                "bandwidth_factor": bandwidth_factor,
                "flops_factor": flops_factor,
            },
        )


@dataclass(frozen=True)
class CostReport:
    """A worker's answer to "what does this model cost on your device" (`ProfileMsg`)."""

    device_name: str
    weight_bytes: int  # the served model's shape, to check a profile file against
    kv_bytes_per_token: int
    num_layers: int
    profile: Profile | None = None  # None: not asked to measure
    cached: bool = False  # read back from the cache folder, not measured now
    probe_s: float = 0.0
    device_memory_bytes: int = 0  # the worker's whole device memory (0: unknown)
    context_len: int = 0  # one request's longest context there, in tokens (0: unknown)

    def check(self, profile: Profile, where: str) -> None:
        """`profile` must be of this model and this kind of device (names both if not)."""
        profile.check_fits(self.weight_bytes, self.kv_bytes_per_token, self.num_layers, where)
        profile.check_device(self.device_name, where)


def _device_kind(name: str) -> str:
    """ "cpu (1 threads)" and "cpu" are one kind of device; GPUs by their name."""
    name = name.strip().lower()
    return "cpu" if name.startswith("cpu") else name


def shipped_profile_path(name: str) -> Path:
    """Where the shipped profile `name` lives (a model's ":" is "-" in file names:
    "llama3-8b:fp8-h200" -> llama3-8b-fp8-h200.json)."""
    return PROFILES_DIR / f"{name.replace(':', '-')}.json"


def load_profile(name_or_path: str) -> Profile:
    """A shipped profile by name (`blitzscale/data/profiles/<name>.json`) or a JSON file."""
    path = Path(name_or_path)
    if not path.suffix:
        path = shipped_profile_path(name_or_path)
    if not path.is_file():
        known = sorted(p.stem for p in PROFILES_DIR.glob("*.json"))
        raise ProfileError(f"no profile {name_or_path!r}; shipped: {', '.join(known)}, or a .json path")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ProfileError(f"{path}: not JSON ({e})") from e
    return Profile.from_json(data, str(path))
