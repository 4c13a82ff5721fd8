"""Planner and policy configs: the design's defaults, TOML loading that rejects typos."""

from __future__ import annotations

import tomllib

import pytest

from blitzscale.control.config import POLICY_NAMES, PlannerConfig, PolicyConfig
from blitzscale.control.planner import prefill_band


def test_defaults_are_the_designs() -> None:
    p = PlannerConfig()
    assert (p.prefill_lower, p.prefill_upper, p.decode_lower, p.decode_upper) == (0.0, 0.0, 0.75, 0.95)
    assert prefill_band(0.0) == (0.5, 0.7)  # (0: derived; a model without a TTFT SLO)
    assert (p.migration_lower, p.migration_upper) == (0.4, 0.8)
    assert (p.scale_down_idle_s, p.shutting_null_keep_s) == (0.333, 1.0)
    q = PolicyConfig()
    assert (q.name, q.sllm_ttl_s, q.sources_only_decode) == ("blitz", 30.0, True)


def test_loads_toml_sections() -> None:
    doc = tomllib.loads(
        """
        [planner]
        tokens_prefilled_per_sec = 12000   # an int for a float knob is fine
        scale_down_idle_s = 1.5
        max_decode = 4
        [policy]
        name = "sllm"
        sllm_ttl_s = 60
        """
    )
    planner = PlannerConfig.from_dict(doc["planner"])
    assert planner.tokens_prefilled_per_sec == 12000.0 and isinstance(planner.tokens_prefilled_per_sec, float)
    assert (planner.scale_down_idle_s, planner.max_decode) == (1.5, 4)
    assert PolicyConfig.from_dict(doc["policy"]) == PolicyConfig(name="sllm", sllm_ttl_s=60.0)


def test_unknown_keys_and_wrong_types_name_the_key() -> None:
    with pytest.raises(ValueError, match=r"unknown key 'prefil_upper' in \[planner\]"):
        PlannerConfig.from_dict({"prefil_upper": 0.8})
    with pytest.raises(ValueError, match=r"unknown key 'ttl' in \[policy\]"):
        PolicyConfig.from_dict({"ttl": 3})
    with pytest.raises(ValueError, match=r"\[planner\] min_prefill must be int"):
        PlannerConfig.from_dict({"min_prefill": 1.5})
    with pytest.raises(ValueError, match=r"\[policy\] sources_only_decode must be bool"):
        PolicyConfig.from_dict({"sources_only_decode": 1})
    with pytest.raises(ValueError, match=r"\[planner\] interval_s must be float"):
        PlannerConfig.from_dict({"interval_s": True})


def test_bad_values_are_refused() -> None:
    with pytest.raises(ValueError, match="decode_lower/decode_upper"):
        PlannerConfig(decode_lower=0.95, decode_upper=0.75)
    with pytest.raises(ValueError, match="min_prefill <= max_prefill"):
        PlannerConfig(min_prefill=3, max_prefill=2)
    with pytest.raises(ValueError, match="unknown policy 'vllm'"):
        PolicyConfig(name="vllm")
    with pytest.raises(ValueError, match="max_sources"):
        PolicyConfig(max_sources=0)


def test_what_each_policy_is_made_of() -> None:
    table = {
        n: (PolicyConfig(name=n).uses_network, PolicyConfig(name=n).multicast, PolicyConfig(name=n).live)
        for n in POLICY_NAMES
    }
    assert table == {
        "blitz": (True, True, True),
        "blitz-nolive": (True, True, False),
        "network": (True, False, False),
        "network-multicast": (True, True, False),
        "sllm": (False, False, False),
        "allcache": (False, False, False),
        "fixed": (False, False, False),
    }
