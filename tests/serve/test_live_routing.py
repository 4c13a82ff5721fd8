"""The router sends a prompt where it is prefilled first when a live target is among the
candidates (`Router.pick`, control/routing.py): a target whose last layers are far off is
not treated as an empty instance, a prompt waits for a full instance that would still
finish it sooner, and the target's arrival estimate comes from its `LiveReadyMsg`. The
router runs over the simulated cluster in process, with instances placed by hand."""

from __future__ import annotations

from blitzscale import clock
from blitzscale.control.costmodel import Profile
from blitzscale.control.snapshot import InstanceState
from blitzscale.messages import LiveReadyMsg
from blitzscale.serve.prefixes import PrefixIndex
from blitzscale.serve.router import Router, RouterConfig
from tests.serve.test_budgets import _router, profile

RATE = 100.0  # prompt tokens a second (slow: seconds of margin for a loaded machine)
BUDGET = 2000  # prompt tokens one instance may have outstanding
COST = profile(RATE)


def _live(loaded_in_s: float, cost: Profile | None = COST, block: int = 0) -> Router:
    """Rank 0 serves (colocated); rank 2 partners rank 1, a live target whose first layers
    landed and whose last land `loaded_in_s` from now (`cost`: the model's cost model;
    `block`: its prefix cache's block size, 0 for none)."""
    router = _router(
        RouterConfig(mode="colocated", prefill_budget_tokens=BUDGET), cost, workers=3, prefix_block_size=block
    )
    for rank in (0, 2):
        router.state.move(rank, InstanceState.LOADING)
        router.state.move(rank, InstanceState.COLOCATED)
    router.state.move(2, InstanceState.OLD_PREFILL)
    router.state.move(1, InstanceState.NEW_PREFILL)
    router.live.begin((1,), 2, (2,))
    router.live.on_live_event(LiveReadyMsg(rank=1, loaded_in_s=loaded_in_s))
    router.connected |= {0, 1, 2}
    return router


def test_the_target_estimate_comes_from_its_live_ready_message() -> None:
    before = clock.now()
    router = _live(3.0)
    eta = router.instances[1].loaded_eta
    assert eta is not None and before + 3.0 <= eta <= clock.now() + 3.0
    router.state.move(1, InstanceState.REFRACTORY_PREFILL, "(fully loaded)")
    assert router.instances[1].loaded_eta is None


def test_a_prompt_goes_where_it_finishes_first_or_waits_for_it() -> None:
    router = _live(30.0)
    router.state.assign(0, 1700)  # rank 0: 17 s of prompts, no room for 400 more
    router.state.assign(2, 3000)  # the partner is busy with its own for 30 s
    # the least loaded would be the target (0 tokens); but it finishes nothing for 30 s
    # (its partner not before 34 s), and rank 0, once it has room, finishes this one 21 s
    # from now: the prompt waits for it
    assert router.pick("colocated", 400) is None
    router.state.take_tokens(0, 1200)  # rank 0 has room again: 9 s
    assert router.pick("colocated", 400) is router.instances[0]
    router.state.assign(0, 2400)  # 29 s outstanding, full: 33 s there, 30 s on the target
    assert router.pick("colocated", 400) is router.instances[1]


def test_an_idle_partner_makes_its_target_worth_a_prompt_before_its_last_layer() -> None:
    router = _live(50.0)
    router.state.assign(0, 1800)  # rank 0 full: 22 s for a 400-token prompt
    pick = router.pick("colocated", 400)
    assert pick is router.instances[1]  # the idle partner finishes it by relays in 4 s


def test_without_a_cost_model_the_least_loaded_takes_it() -> None:
    router = _live(9.0, cost=None)
    router.state.assign(0, 100)
    assert router.pick("colocated", 400) is router.instances[1]


def test_a_prompt_whose_prefix_an_instance_holds_is_timed_there_by_the_rest_of_it() -> None:
    """An 800-token prompt whose first 768 tokens rank 0 has cached: whole, it would finish
    there in 19 s against the target's 15; only its last 32 tokens to prefill, in 11.3 s.
    (Session 32: with a live target loading, routing had stopped counting cached prefixes,
    and prompts left their prefix for an idle target.)"""
    router = _live(15.0, block=16)
    router.state.assign(0, 1100)  # rank 0: 11 s of prompts, room for 800 more
    router.state.assign(2, 3000)  # the partner is busy: the target finishes nothing for 15 s
    hashes = PrefixIndex.hashes(list(range(801)), 16)  # 50 full blocks
    assert router.pick("colocated", 800, "m", hashes) is router.instances[1]  # nothing cached yet
    router.prefixes.record("m", 0, router.instances[0].loaded_at, hashes[:48], 1000)
    assert router.pick("colocated", 800, "m", hashes) is router.instances[0]
    assert router.pick("colocated", 800, "m", None) is router.instances[1]  # (no prefix given)
