"""`blitzscale serve` configuration: one TOML file, one typed section per concern.

    [model]    name = "smollm2-135m", tp (ranks per instance), keep_alive_s (every model's)
    [[models]] several models on one pool: name, source, tp, min/max_instances, keep_alive_s
    [server]   host, port, api_key
    [cluster]  workers, device, ports, timeouts       (blitzscale.cluster.config.ClusterConfig)
    [router]   mode = "pd" | "colocated", budgets     (blitzscale.serve.router.RouterConfig)
    [engine]   block_size, num_kv_blocks, ...         (blitzscale.core.config.EngineConfig)
    [planner]  bands, rates, bounds, idle thresholds  (blitzscale.control.config.PlannerConfig)
    [policy]   name = "blitz" | ... , fixed counts    (blitzscale.control.config.PolicyConfig)

Unknown sections or keys are errors that name them; command-line flags override the file.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blitzscale.cluster.config import ClusterConfig
from blitzscale.control.config import PlannerConfig, PolicyConfig
from blitzscale.core.config import EngineConfig
from blitzscale.errors import InvalidRequestError
from blitzscale.serve.router import RouterConfig
from blitzscale.tomlfile import read_toml


@dataclass(frozen=True)
class ModelSection:
    name: str = "smollm2-135m"
    cache_dir: str = ""  # where converted models are kept ("" = ~/.cache/blitzscale/models)
    tp: int = 1  # tensor-parallel ranks per instance (consecutive ranks; workers a multiple)
    # Seconds without a request after which a model scales to zero (inf: never); the
    # default of every model, `[[models]]` may set its own.
    keep_alive_s: float = math.inf
    # The time to first token to hold (seconds; 0: none): the planner scales so that an
    # instance's queued prompt work stays within half of it ([planner] prefill_lower /
    # prefill_upper unset). The default of every model, `[[models]]` may set its own.
    ttft_slo_s: float = 0.0
    # The model's cost model on the workers' device (a JSON file from `blitzscale profile`);
    # "" = measured by a worker at start (and kept under the cache folder's profiles/).
    profile: str = ""
    # Another model's tokenizer (a name or path with one) for every model, as vLLM's
    # --tokenizer: e.g. a random:* benchmark model, which has none, can then take text,
    # chat and response_format; "" = each model's own. `[[models]] tokenizer` overrides it.
    tokenizer: str = ""

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"tp must be at least 1, got {self.tp}")
        _check_keep_alive("keep_alive_s", self.keep_alive_s)
        _check_slo("ttft_slo_s", self.ttft_slo_s)


def _check_slo(name: str, value: float) -> None:
    if not (value >= 0 and math.isfinite(value)):  # (NaN too)
        raise ValueError(f"{name} must be a number of seconds >= 0 (0: none), got {value}")


def _check_keep_alive(name: str, value: float) -> None:
    if not value >= 0:  # (NaN too)
        raise ValueError(f"{name} must be >= 0 seconds (inf: never scale to zero), got {value}")


@dataclass(frozen=True)
class ModelEntry:
    """One served model (a `[[models]]` table, or `--model NAME=SOURCE`). The same source
    under two names is two models, each with its own copies."""

    name: str
    source: str = ""  # what to load ("" = the name)
    tp: int = 0  # 0: [model] tp (every model has the same tp)
    min_instances: int = 0  # 0: may scale to zero after keep_alive_s without a request
    max_instances: int = 0  # 0: no bound
    keep_alive_s: float | None = None  # None: [model] keep_alive_s
    tokenizer: str = ""  # "": [model] tokenizer (whose "" is the model's own)
    ttft_slo_s: float | None = None  # None: [model] ttft_slo_s

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ValueError(f"a model's name must not be empty, got {self.name!r}")
        if self.tp < 0 or self.min_instances < 0 or self.max_instances < 0:
            raise ValueError(
                f"model {self.name!r}: tp, min_instances and max_instances must be >= 0, got "
                f"{self.tp}/{self.min_instances}/{self.max_instances}"
            )
        if self.max_instances and self.min_instances > self.max_instances:
            raise ValueError(
                f"model {self.name!r}: min_instances={self.min_instances} is more than "
                f"max_instances={self.max_instances}"
            )
        if self.keep_alive_s is not None:
            _check_keep_alive(f"model {self.name!r}: keep_alive_s", self.keep_alive_s)
        if self.ttft_slo_s is not None:
            _check_slo(f"model {self.name!r}: ttft_slo_s", self.ttft_slo_s)

    @property
    def spec(self) -> str:
        return self.source or self.name


@dataclass(frozen=True)
class ServerSection:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str = ""
    max_body_bytes: int = 2 << 20  # larger request bodies get 413 (a 2048-token prompt is ~10 KB)
    shutdown_timeout_s: float = 5.0  # on SIGTERM, requests still running after this are cut

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
        if not self.shutdown_timeout_s >= 0:  # (NaN too)
            raise ValueError(f"shutdown_timeout_s must be >= 0, got {self.shutdown_timeout_s}")


# What every instance's engine gets unless the [engine] section says otherwise, on either
# device: small blocks; the KV cache sized for the device (num_kv_blocks 0): on a GPU from its
# free memory (gpu_memory_utilization), on CPU from kv_cache_bytes (360 MiB: 512 blocks of
# SmolLM2 in fp32); the model's own context (max_model_len 0).
# Step limits (max_num_batched_tokens, max_num_seqs) are the device's (core/config.py).
SERVE_ENGINE = EngineConfig(block_size=16, num_kv_blocks=0, kv_cache_bytes=360 << 20, max_model_len=0)


@dataclass(frozen=True)
class ServeConfig:
    model: ModelSection = field(default_factory=ModelSection)
    server: ServerSection = field(default_factory=ServerSection)
    cluster: ClusterConfig = field(default_factory=lambda: ClusterConfig(num_workers=3))
    router: RouterConfig = field(default_factory=RouterConfig)
    engine: EngineConfig = field(default_factory=lambda: SERVE_ENGINE)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    models: tuple[ModelEntry, ...] = ()  # [[models]]; none: the one model of [model]

    def __post_init__(self) -> None:
        """What several models and tensor parallelism need of the other sections (before
        any worker starts)."""
        self._check_models()
        tp = self.model.tp
        if self.engine.models_per_device != 1:
            raise InvalidRequestError(
                "[engine] models_per_device is set from [cluster] models_per_rank (--models-per-rank); "
                f"leave it out (got {self.engine.models_per_device})"
            )
        per_rank = self.cluster.models_per_rank
        if per_rank > 1 and tp > 1:
            raise InvalidRequestError(
                f"[cluster] models_per_rank={per_rank} needs tp=1: a tensor-parallel rank serves one "
                f"model at a time (got tp={tp})"
            )
        if tp == 1:
            return
        if self.cluster.num_workers % tp:
            raise InvalidRequestError(
                f"workers={self.cluster.num_workers} is not a multiple of tp={tp} "
                "(an instance is tp consecutive workers)"
            )

    def _check_models(self) -> None:
        seen: set[str] = set()
        for m in self.models:
            if m.name in seen:
                raise InvalidRequestError(f"[[models]]: the name {m.name!r} is given twice")
            seen.add(m.name)
            if m.tp and m.tp != self.model.tp:
                raise InvalidRequestError(
                    f"[[models]] {m.name!r}: tp={m.tp}, but every model has [model] tp={self.model.tp} "
                    "(one instance size for the whole pool)"
                )

    def served_models(self) -> tuple[ModelEntry, ...]:
        """Every model served, first the default one, each with its source, tp and
        keep-alive filled in (one model: [model] as a one-entry list)."""
        m = self.model
        entries = self.models or (ModelEntry(name=m.name),)
        return tuple(
            dataclasses.replace(
                e,
                source=e.spec,
                tp=m.tp,
                keep_alive_s=m.keep_alive_s if e.keep_alive_s is None else e.keep_alive_s,
                tokenizer=e.tokenizer or m.tokenizer,
            )
            for e in entries
        )

    def with_overrides(self, **sections: Any) -> ServeConfig:
        """A copy with some keys of some sections replaced (flags over the file);
        `models` (a list of ModelEntry) replaces the file's [[models]]."""
        changes: dict[str, Any] = {}
        for name, values in sections.items():
            if name == "models":
                if values:
                    changes["models"] = tuple(values)
                continue
            if values:
                changes[name] = _section(type(getattr(self, name)), name, values, base=getattr(self, name))
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_toml(self) -> str:
        """Every section and knob with its value: a complete, loadable cluster file."""
        lines = []
        for name, values in self.to_dict().items():
            if name == "models":
                continue
            lines.append(f"[{name}]")
            derived = _DERIVED.get(name, ())
            lines += [
                f"{k} = {_toml_value(v)}" for k, v in values.items() if v is not None and k not in derived
            ]
            lines.append("")
        for entry in self.models:  # [[models]] tables last (none: one model, [model])
            lines.append("[[models]]")
            lines += [
                f"{k} = {_toml_value(v)}" for k, v in dataclasses.asdict(entry).items() if v is not None
            ]
            lines.append("")
        return "\n".join(lines)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(v)


_SECTIONS = {f.name for f in dataclasses.fields(ServeConfig)}
# Knobs set from another section, never written: [engine] models_per_device is [cluster]
# models_per_rank (the workers' engines are told it)
_DERIVED = {"engine": ("models_per_device",)}
_TABLE_LISTS = {"models"}  # [[models]]: a list of tables, not a section


def _section(cls: type[Any], name: str, values: dict[str, Any], base: Any = None) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise InvalidRequestError(
            f"unknown key {unknown[0]!r} in [{name}]; known keys: {', '.join(sorted(known))}"
        )
    if not hasattr(cls, "from_dict"):  # (from_dict checks its own types)
        values = _typed(cls, name, values)
    try:
        if base is not None and hasattr(cls, "from_dict"):  # it converts values (1 -> 1.0)
            return cls.from_dict({**dataclasses.asdict(base), **values})
        if base is not None:
            return dataclasses.replace(base, **values)
        if hasattr(cls, "from_dict"):
            return cls.from_dict(values)
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise InvalidRequestError(f"[{name}]: {e}") from e


def _typed(cls: type[Any], name: str, values: dict[str, Any]) -> dict[str, Any]:
    """`values` with each checked against its field's type (an int where a float belongs
    becomes a float, as TOML writes `1`); a wrong type is named with the key and the value,
    before any range check could trip over it."""
    hints = typing.get_type_hints(cls)
    out = {}
    for key, value in values.items():
        want = hints[key]
        if float in _alternatives(want) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not _fits(value, want):
            raise InvalidRequestError(
                f"[{name}] {key} must be {_describe(want)}, got {value!r} ({type(value).__name__})"
            )
        out[key] = value
    return out


def _alternatives(want: Any) -> tuple[Any, ...]:
    if typing.get_origin(want) in (typing.Union, types.UnionType):
        return typing.get_args(want)
    return (want,)


def _fits(value: Any, want: Any) -> bool:
    for alt in _alternatives(want):
        origin = typing.get_origin(alt)
        if alt is type(None) and value is None:
            return True
        if origin is typing.Literal and value in typing.get_args(alt):
            return True
        if alt is bool and isinstance(value, bool):
            return True
        if alt in (int, float, str) and isinstance(value, alt) and not isinstance(value, bool):
            return True
        if origin in (tuple, list) and isinstance(value, tuple | list):
            return True
        if origin is None and alt not in (bool, int, float, str, type(None)):
            return True  # a type this check does not know: the dataclass judges it
    return False


def _describe(want: Any) -> str:
    names = {
        int: "an integer",
        float: "a number",
        str: "a string",
        bool: "true or false",
        type(None): "unset",
    }
    parts = []
    for alt in _alternatives(want):
        if typing.get_origin(alt) is typing.Literal:
            parts.append(" or ".join(repr(a) for a in typing.get_args(alt)))
        else:
            parts.append(names.get(alt, getattr(alt, "__name__", str(alt))))
    return " or ".join(parts)


def load_serve_config(path: Path | None) -> ServeConfig:
    if path is None:
        return ServeConfig()
    data = read_toml(path, f"--config {path}")
    unknown = sorted(set(data) - _SECTIONS)
    if unknown:
        raise InvalidRequestError(
            f"--config {path}: unknown section [{unknown[0]}]; known: {sorted(_SECTIONS)}"
        )
    base = ServeConfig()
    parts: dict[str, Any] = {  # a section sets what it names; the rest keeps serve's defaults
        name: _section(type(getattr(base, name)), name, values, base=getattr(base, name))
        for name, values in data.items()
        if name not in _TABLE_LISTS
    }
    if "models" in data:
        parts["models"] = model_entries(data["models"])
    try:
        return dataclasses.replace(base, **parts)
    except (TypeError, ValueError) as e:
        raise InvalidRequestError(f"--config {path}: {e}") from e


def model_entries(tables: Any) -> tuple[ModelEntry, ...]:
    """`[[models]]` tables, each key's type checked (and named) before any range check."""
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise InvalidRequestError(
            f"models must be [[models]] tables (name, source, tp, ...), got {type(tables).__name__}"
        )
    out = []
    for k, table in enumerate(tables):
        if "name" not in table:
            raise InvalidRequestError(f"[[models]] number {k + 1} has no name (keys: {sorted(table)})")
        out.append(_section(ModelEntry, "[models]", table))
    return tuple(out)


def parse_model_flag(value: str) -> ModelEntry:
    """`--model NAME=SOURCE` (or a bare SOURCE, served under its own name)."""
    name, sep, source = value.partition("=")
    if sep and (not name.strip() or not source.strip()):
        raise InvalidRequestError(f"--model {value!r}: expected NAME=SOURCE (or a bare SOURCE)")
    if not value.strip():
        raise InvalidRequestError("--model must not be empty")
    try:
        return ModelEntry(name=name.strip(), source=source.strip()) if sep else ModelEntry(name=value)
    except ValueError as e:
        raise InvalidRequestError(f"--model {value!r}: {e}") from e
