"""Routing by when a prompt finishes (control/routing.py): a loading live target is not an
empty instance; its partner's pipeline can finish its tasks sooner; a prompt waits for a
full instance that would still finish it first."""

from __future__ import annotations

import pytest

from blitzscale.control.routing import Option, finish_first, finish_s

RATE = 1000.0  # prompt tokens a second


def test_a_loading_target_finishes_no_sooner_than_its_last_layer() -> None:
    target = Option(rank=1, outstanding_tokens=0, has_room=True, loaded_in_s=2.0)
    assert finish_s(target, 500, RATE) == 2.0
    busy = Option(rank=2, outstanding_tokens=3000, has_room=True)
    assert finish_s(busy, 500, RATE) == 3.5
    assert finish_first([target, busy], 500, RATE) == 1  # still sooner than a long queue
    light = Option(rank=3, outstanding_tokens=1000, has_room=True)
    assert finish_first([target, light], 500, RATE) == 3  # 1.5 s beats 2 s


def test_the_partner_pipeline_can_finish_a_targets_prompt_before_its_last_layer() -> None:
    idle_partner = Option(rank=1, outstanding_tokens=0, has_room=True, loaded_in_s=2.0, pipeline_tokens=200)
    assert finish_s(idle_partner, 500, RATE) == pytest.approx(0.7)
    shared = Option(rank=1, outstanding_tokens=0, has_room=True, loaded_in_s=2.0, pipeline_tokens=9000)
    assert finish_s(shared, 500, RATE) == 2.0  # three targets on one busy partner: no help


def test_a_prompt_waits_for_a_full_instance_that_finishes_it_sooner() -> None:
    target = Option(rank=1, outstanding_tokens=4000, has_room=True, loaded_in_s=2.5)
    full = Option(rank=2, outstanding_tokens=1500, has_room=False)
    assert finish_first([target, full], 500, RATE) is None  # 2.0 s there against 4.5 s
    far_full = Option(rank=2, outstanding_tokens=6000, has_room=False)
    assert finish_first([target, far_full], 500, RATE) == 1
    assert finish_first([full], 500, RATE) is None  # nothing with room
    assert finish_first([], 500, RATE) is None


def test_ties_go_to_the_fewest_outstanding_tokens_and_a_bad_rate_is_refused() -> None:
    a = Option(rank=1, outstanding_tokens=100, has_room=True, loaded_in_s=3.0)
    b = Option(rank=2, outstanding_tokens=0, has_room=True, loaded_in_s=3.0)
    assert finish_first([a, b], 10, RATE) == 2
    with pytest.raises(ValueError, match="rate"):
        finish_first([a], 10, 0.0)


def test_tokens_an_instance_has_cached_are_not_prefilled_again() -> None:
    target = Option(rank=1, outstanding_tokens=0, has_room=True, loaded_in_s=1.5)
    holder = Option(rank=2, outstanding_tokens=1000, has_room=True, cached_tokens=700)
    assert finish_s(holder, 800, RATE) == pytest.approx(1.1)  # 1000 + the 100 not cached
    assert finish_first([target, holder], 800, RATE) == 2
    whole = Option(rank=2, outstanding_tokens=1000, has_room=True)
    assert finish_first([target, whole], 800, RATE) == 1  # 1.8 s without the cache
    assert finish_s(Option(rank=3, outstanding_tokens=0, has_room=True, cached_tokens=900), 800, RATE) == 0.0
    # a live target's partner runs its layers for the whole prompt, cached there or not
    piped = Option(
        rank=4, outstanding_tokens=0, has_room=True, loaded_in_s=2.0, pipeline_tokens=200, cached_tokens=700
    )
    assert finish_s(piped, 800, RATE) == pytest.approx(1.0)
