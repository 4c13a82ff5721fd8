"""Typed knobs of the planner (`[planner]`) and of the scaling policy (`[policy]`).

Every default comes from the design (§5, §6) unless its comment says otherwise. `from_dict`
loads a TOML section and refuses keys it does not know, so a typo fails loudly instead of
silently running with a default.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

POLICY_NAMES = ("blitz", "blitz-nolive", "network", "network-multicast", "sllm", "allcache", "fixed")
_NETWORK_POLICIES = ("blitz", "blitz-nolive", "network", "network-multicast")


def _check_band(name: str, lower: float, upper: float, derived: bool = False) -> None:
    if derived and (lower == 0.0 or upper == 0.0) and lower >= 0.0 and upper >= 0.0:
        return  # (an edge left at 0 is derived: planner.prefill_band)
    if not 0.0 < lower < upper:
        zero = " (0: derived)" if derived else ""
        raise ValueError(
            f"{name}_lower/{name}_upper must satisfy 0 < lower < upper{zero}, got {lower}/{upper}"
        )


def _from_dict(cls: type[Any], section: str, d: Mapping[str, Any]) -> Any:
    """Build a frozen config from a TOML table: unknown keys and wrong types name the key."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in d.items():
        if key not in known:
            raise ValueError(f"unknown key {key!r} in [{section}]; known keys: {', '.join(sorted(known))}")
        want = hints[key]
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)  # TOML writes `1` for a float knob set to a whole number
        ok = isinstance(value, want) and (want is bool or not isinstance(value, bool))
        if not ok:
            raise ValueError(f"[{section}] {key} must be {want.__name__}, got {value!r}")
        kwargs[key] = value
    return cls(**kwargs)


@dataclass(frozen=True)
class PlannerConfig:
    """The planner's utilisation bands, per-instance rates and bounds (design §5).

    A band [lower, upper] reads: scale up when an instance would be busier than `upper`,
    scale down when it would be less busy than `lower`; the gap is the hysteresis.
    """

    # Seconds of queued prompt work per instance (queued prompt tokens / its prefill rate);
    # 0: derived (planner.prefill_band): the upper edge from the model's TTFT SLO (0.7 for a
    # model without one), the lower from the upper (0.5 / 0.7 of it).
    prefill_lower: float = 0.0
    prefill_upper: float = 0.0
    decode_lower: float = 0.75
    decode_upper: float = 0.95
    migration_lower: float = 0.4
    migration_upper: float = 0.8
    # Prompt tokens one instance prefills per second; 0: the model's measured cost model
    # (control/costmodel.py; the prototype typed 12000-13000 for 8B/24B on its GPUs).
    tokens_prefilled_per_sec: float = 0.0
    # KV tokens one decode instance can receive by migration per second (inbound link).
    # Our guess for CPU workers over gloo (SmolLM2 fp32 KV is ~46 KB a token): override.
    tokens_transferred_per_sec: float = 20000.0
    max_blocks_per_instance: int = 0  # KV blocks per instance; 0: largest total_blocks in the snapshot
    min_prefill: int = 1  # bounds per role; colocated instances use the prefill bounds
    max_prefill: int = 0  # 0: no upper bound
    min_decode: int = 1
    max_decode: int = 0
    scale_down_idle_s: float = 0.333  # an instance must be idle this long to be drained
    shutting_null_keep_s: float = 1.0  # a warm (SHUTTING_NULL) instance is released after this
    interval_s: float = 0.1  # how often the router runs the planner (our choice)
    # No thrash (our choice): an instance is drained only once it has been idle, and loaded,
    # for this many times as long as its load took, and stays warm as long before release.
    # With the paper's millisecond loads this leaves the idle thresholds above in charge.
    reload_cost_factor: float = 3.0
    load_retry_s: float = 1.0  # a rank whose load failed waits this long (doubling) to be tried again
    max_load_failures: int = 3  # failed loads in a row that take a rank out of service (0: never)

    def __post_init__(self) -> None:
        _check_band("prefill", self.prefill_lower, self.prefill_upper, derived=True)
        _check_band("decode", self.decode_lower, self.decode_upper)
        _check_band("migration", self.migration_lower, self.migration_upper)
        if self.tokens_prefilled_per_sec < 0 or self.tokens_transferred_per_sec <= 0:
            raise ValueError(
                "tokens_prefilled_per_sec must be >= 0 (0: measured) and tokens_transferred_per_sec > 0, "
                f"got {self.tokens_prefilled_per_sec}/{self.tokens_transferred_per_sec}"
            )
        if self.max_blocks_per_instance < 0:
            raise ValueError(f"max_blocks_per_instance must be >= 0, got {self.max_blocks_per_instance}")
        for role in ("prefill", "decode"):
            lo, hi = getattr(self, f"min_{role}"), getattr(self, f"max_{role}")
            if lo < 1 or (hi != 0 and hi < lo):
                raise ValueError(f"need 1 <= min_{role} <= max_{role} (0 = no max), got {lo}/{hi}")
        at_least_zero = ("reload_cost_factor", "load_retry_s", "max_load_failures")
        for name in (*at_least_zero, "scale_down_idle_s", "shutting_null_keep_s"):
            if not getattr(self, name) >= 0:  # (NaN too)
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.interval_s > 0:
            raise ValueError(f"interval_s must be > 0 seconds, got {self.interval_s}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        return typing.cast(Self, _from_dict(cls, "planner", d))


@dataclass(frozen=True)
class PolicyConfig:
    """Which scaling policy runs (design §6) and its knobs."""

    name: str = "blitz"  # one of POLICY_NAMES
    # `fixed`: instances the launcher provisions; the policy never scales, but loads again
    # an instance it lost (policies.fixed_actions)
    fixed_prefill: int = 1
    fixed_decode: int = 1
    sllm_ttl_s: float = 30.0  # `sllm`: a host keeps a checkpoint this long after last serving it
    max_sources: int = 4  # network policies: at most this many source instances (stripes)
    sources_only_decode: bool = True  # spare prefill instances' outbound links (KV migration)
    # Network scale-ups: the source's most reused cached prefixes follow the weights, up to
    # this share of the new instance's KV blocks (0: the new instance starts with none).
    hot_prefix_share: float = 0.1
    # Multicast policies: a GPU-to-GPU load whose source is still sending the same model
    # joins that chain (its last target forwards each layer as it lands) instead of
    # waiting for the source (cluster/flights.py).
    join_chains: bool = True

    def __post_init__(self) -> None:
        if self.name not in POLICY_NAMES:
            raise ValueError(f"unknown policy {self.name!r}; known: {', '.join(POLICY_NAMES)}")
        for name in ("fixed_prefill", "fixed_decode"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.sllm_ttl_s < 0:
            raise ValueError(f"sllm_ttl_s must be >= 0, got {self.sllm_ttl_s}")
        if self.max_sources < 1:
            raise ValueError(f"max_sources must be >= 1, got {self.max_sources}")
        if not 0 <= self.hot_prefix_share <= 1:
            raise ValueError(f"hot_prefix_share must be in [0, 1], got {self.hot_prefix_share}")

    @property
    def uses_network(self) -> bool:
        """Loads come from GPUs that hold the model (host copy or disk only from zero)."""
        return self.name in _NETWORK_POLICIES

    @property
    def multicast(self) -> bool:
        return self.name in ("blitz", "blitz-nolive", "network-multicast")

    @property
    def joins_chains(self) -> bool:
        return self.multicast and self.join_chains

    @property
    def live(self) -> bool:
        return self.name == "blitz"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        return typing.cast(Self, _from_dict(cls, "policy", d))
