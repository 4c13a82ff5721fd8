"""The router's relays around a loading live target (serve/live.py): a fully loaded target
with a single task keeps it (a relay would only redo its layers after a transfer), and a
head task that would miss its TTFT SLO on a loading target moves to the ordinary instance
that finishes it soonest. LiveScaling runs against the few router operations it uses and a
data plane that records what it is told to send."""

from __future__ import annotations

import asyncio

from blitzscale import clock
from blitzscale.control.costmodel import Profile
from blitzscale.control.snapshot import InstanceState as S
from blitzscale.core.sampling import SamplingParams
from blitzscale.messages import LiveReadyMsg, RelayedMsg, RelayInMsg, RelayMsg
from blitzscale.serve.live import LiveScaling
from blitzscale.serve.requests import RouterRequest, Stage
from tests.serve.test_budgets import profile
from tests.serve.test_live_relays import _Router

RATE = 1000.0  # prompt tokens a second
COST: Profile = profile(RATE)


class _Owner(_Router):
    def __init__(self, slo_s: float) -> None:
        super().__init__()
        self.slo_s = slo_s

    def prefilling_on(self, rank: int) -> list[RouterRequest]:
        mine = [r for r in self.requests.values() if r.prefill_rank == rank and r.relay_from is None]
        return sorted(mine, key=lambda r: r.dispatched_at or 0.0)

    def cost(self, model: str) -> Profile | None:
        return COST

    def ttft_slo_s(self, model: str) -> float:
        return self.slo_s


def _setup(slo_s: float, loaded_in_s: float) -> tuple[_Owner, LiveScaling]:
    """Rank 0 and rank 2 serve (pd prefill); rank 2 partners rank 1, a live target whose
    last layer lands `loaded_in_s` from now; the partner is busy with its own prompts."""
    owner = _Owner(slo_s)
    st = owner.state
    for rank in (0, 2):
        st.move(rank, S.LOADING)
        st.move(rank, S.PREFILL)
    st.move(2, S.OLD_PREFILL)
    st.move(1, S.NEW_PREFILL)
    live = LiveScaling(owner, pd_mode=True)
    live.begin((1,), 2, (2,))
    live.on_live_event(LiveReadyMsg(rank=1, loaded_in_s=loaded_in_s))
    owner.connected |= {0, 1, 2}
    st.assign(2, 800)  # the partner: 0.8 s of its own prompts
    return owner, live


def _task(owner: _Owner, rid: str, rank: int, tokens: int, waited_s: float = 0.0) -> RouterRequest:
    r = RouterRequest(
        rid, [1] * tokens, SamplingParams(max_tokens=1), model="m", arrival=clock.now() - waited_s
    )
    r.move(Stage.PREFILL)
    r.prefill_rank, r.dispatched_at = rank, clock.now()
    owner.state.assign(rank, tokens)
    owner.requests[rid] = r
    return r


def _relay_asks(owner: _Owner) -> list[tuple[int, int]]:
    return [(rank, m.dst_rank) for rank, m in owner.data.sent if isinstance(m, RelayMsg)]


def test_a_loaded_target_keeps_its_only_task_and_hands_over_one_of_several() -> None:
    owner, live = _setup(slo_s=0.0, loaded_in_s=5.0)
    owner.state.move(1, S.REFRACTORY_PREFILL, "(fully loaded)")
    owner.state.take_tokens(2, 800)  # the partner is idle now
    _task(owner, "a", 1, 400)
    asyncio.run(live.round())
    assert _relay_asks(owner) == []  # it finishes its one task sooner itself
    _task(owner, "b", 1, 400)
    asyncio.run(live.round())
    assert _relay_asks(owner) == [(1, 2)]  # the idle partner takes one of two


def test_a_head_that_would_miss_its_slo_moves_to_the_instance_that_makes_it() -> None:
    # the target's last layer lands in 3 s; the SLO is 1 s; rank 0 holds 0.2 s of prompts
    owner, live = _setup(slo_s=1.0, loaded_in_s=3.0)
    owner.state.assign(0, 200)
    head = _task(owner, "late", 1, 300, waited_s=0.1)
    asyncio.run(live.round())
    assert _relay_asks(owner) == [(1, 0)]  # 0.5 s on rank 0, against 3 s where it is
    asyncio.run(live.round())
    assert _relay_asks(owner) == [(1, 0)]  # (asked once)
    asyncio.run(live.on_relayed(RelayedMsg(rank=1, request_id="late", layer=5, live_layers=5)))
    (rin,) = [(rank, m) for rank, m in owner.data.sent if isinstance(m, RelayInMsg)]
    assert rin[0] == 0 and rin[1].layer == 5 and rin[1].src_rank == 1
    assert head.prefill_rank == 0 and head.relay_from == 1
    assert live.moves_total == 1 and live.relays_total == 1
    assert live.relays["late"].source == 0


def test_a_head_that_makes_its_slo_or_has_nowhere_better_stays() -> None:
    owner, live = _setup(slo_s=5.0, loaded_in_s=3.0)  # 3 s there is within the SLO
    _task(owner, "fine", 1, 300)
    asyncio.run(live.round())
    assert _relay_asks(owner) == []
    owner, live = _setup(slo_s=1.0, loaded_in_s=3.0)
    owner.state.assign(0, 1000)  # rank 0 is full (budget 1024 tokens)
    _task(owner, "late", 1, 300)
    asyncio.run(live.round())
    assert _relay_asks(owner) == []
    owner, live = _setup(slo_s=0.0, loaded_in_s=3.0)  # no SLO: nothing to miss
    _task(owner, "any", 1, 300)
    asyncio.run(live.round())
    assert _relay_asks(owner) == []


def test_a_move_whose_destination_stopped_serving_leaves_the_task_where_it_is() -> None:
    owner, live = _setup(slo_s=1.0, loaded_in_s=3.0)
    head = _task(owner, "late", 1, 300)
    asyncio.run(live.round())
    assert _relay_asks(owner) == [(1, 0)]
    owner.state.move(0, S.SHUTTING_PREFILL)
    asyncio.run(live.on_relayed(RelayedMsg(rank=1, request_id="late", layer=2, live_layers=2)))
    assert not [m for _, m in owner.data.sent if isinstance(m, RelayInMsg)]
    assert head.prefill_rank == 1 and live.moves_total == 0 and not live.relays


def test_two_heads_moved_in_one_round_do_not_both_count_on_the_same_instance() -> None:
    """Two loading targets sharing partner 2, each with a head that would miss its SLO: the
    first moves to rank 0 (0.6 s there, 0.9 on rank 4); for the second, rank 0 holds the
    first's 600 tokens on their way (over its 1,024-token budget with its own 600), so it
    moves to rank 4. Counting rank 0 as empty sent both there (paper-b, session 31: the
    second of two such prompts finished 0.2 s late)."""
    owner, live = _setup(slo_s=1.0, loaded_in_s=3.0)
    st = owner.state
    st.move(4, S.LOADING)
    st.move(4, S.PREFILL)
    st.move(3, S.NEW_PREFILL)
    live.begin((3,), 2, (2,))
    live.on_live_event(LiveReadyMsg(rank=3, loaded_in_s=3.0))
    owner.connected |= {3, 4}
    st.assign(4, 300)
    _task(owner, "first", 1, 600, waited_s=0.1)
    _task(owner, "second", 3, 600, waited_s=0.1)
    asyncio.run(live.round())
    assert _relay_asks(owner) == [(1, 0), (3, 4)]
