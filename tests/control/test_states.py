"""The instance state machine: legal moves pass, illegal ones name both states."""

from __future__ import annotations

import pytest

from blitzscale.control.snapshot import InstanceState as S
from blitzscale.control.states import (
    TRANSITIONS,
    can_source,
    check_transition,
    counts_as_colocated,
    counts_as_decode,
    counts_as_prefill,
    holds_weights,
    is_serving,
    is_shutting,
)


def test_every_state_has_its_transitions_and_may_fall_back_to_inactive() -> None:
    assert set(TRANSITIONS) == set(S)
    for state in S:
        if state is not S.INACTIVE:
            check_transition(state, S.INACTIVE)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (S.INACTIVE, S.LOADING),
        (S.LOADING, S.PREFILL),
        (S.INACTIVE, S.NEW_PREFILL),
        (S.NEW_PREFILL, S.REFRACTORY_PREFILL),
        (S.REFRACTORY_PREFILL, S.PREFILL),
        (S.PREFILL, S.OLD_PREFILL),
        (S.OLD_PREFILL, S.PREFILL),
        (S.PREFILL, S.MUTATING_TO_DECODE),
        (S.MUTATING_TO_DECODE, S.DECODE),
        (S.DECODE, S.SHUTTING_DECODE),
        (S.PREFILL, S.SHUTTING_PREFILL),
        (S.SHUTTING_PREFILL, S.PREFILL),
        (S.SHUTTING_DECODE, S.SHUTTING_NULL),
        (S.SHUTTING_NULL, S.DECODE),
        (S.SHUTTING_NULL, S.INACTIVE),
        (S.LOADING, S.COLOCATED),
        (S.COLOCATED, S.SHUTTING_DECODE),
    ],
)
def test_legal_transitions_pass(a: S, b: S) -> None:
    check_transition(a, b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (S.LOADING, S.DECODE),  # decode instances are only made by mutation
        (S.NEW_PREFILL, S.DECODE),  # ... and never live-scaled
        (S.DECODE, S.PREFILL),
        (S.INACTIVE, S.PREFILL),  # weights must arrive first
        (S.SHUTTING_NULL, S.SHUTTING_PREFILL),
        (S.SHUTTING_PREFILL, S.DECODE),  # a draining instance returns only to its own role
        (S.MUTATING_TO_DECODE, S.PREFILL),
        (S.INACTIVE, S.INACTIVE),
    ],
)
def test_illegal_transitions_name_both_states(a: S, b: S) -> None:
    with pytest.raises(ValueError, match=f"{a.name} -> {b.name}"):
        check_transition(a, b)


def test_predicates() -> None:
    serving = {s for s in S if is_serving(s)}
    assert serving == {S.PREFILL, S.DECODE, S.COLOCATED, S.NEW_PREFILL, S.OLD_PREFILL, S.REFRACTORY_PREFILL}
    assert {s for s in S if is_shutting(s)} == {S.SHUTTING_PREFILL, S.SHUTTING_DECODE, S.SHUTTING_NULL}
    assert {s for s in S if not holds_weights(s)} == {S.INACTIVE, S.LOADING, S.NEW_PREFILL}
    assert {s for s in S if holds_weights(s) and not can_source(s)} == {S.OLD_PREFILL}
    prefill = {S.LOADING, S.NEW_PREFILL, S.OLD_PREFILL, S.REFRACTORY_PREFILL, S.PREFILL}
    assert {s for s in S if counts_as_prefill(s)} == prefill
    assert {s for s in S if counts_as_decode(s)} == {S.DECODE, S.MUTATING_TO_DECODE}
    assert {s for s in S if counts_as_colocated(s)} == prefill | {S.COLOCATED}
