"""A live target under the router's split (LiveOrder.plan, control/live_split.py): a task
stops at its planned layer and waits for its partner, which takes it before the head; a task
planned to stay whole is not handed over while weights arrive; once loaded the plan no longer
holds anything back. Torch-free: the order alone, as the simulator runs it."""

from __future__ import annotations

from blitzscale.core.sampling import SamplingParams
from blitzscale.engine.live_order import LiveOrder
from blitzscale.engine.request import Request
from blitzscale.kvcache.pool import BlockPool
from blitzscale.model.readiness import SegmentReadiness

LAYERS = 4


def _order(landed_segments: int) -> tuple[LiveOrder, SegmentReadiness]:
    ready = SegmentReadiness(LAYERS + 2)  # embedding, 4 layers, head
    for s in range(landed_segments):
        ready.add(s)
    return LiveOrder(BlockPool(64, 16), 4096, ready, LAYERS), ready


def _req(rid: str) -> Request:
    return Request(rid, list(range(20)), SamplingParams(max_tokens=1))


def _run_until_stuck(order: LiveOrder) -> None:
    while batch := order.next_batch():
        stage = batch[0].stage
        if stage == 0:
            order.ran(batch, 0)
        elif stage == order.head_stage:
            order.ran(batch, stage)
        else:
            order.ran(batch, stage, order.layers(stage, loading=not order.readiness.all_ready), True)


def _stages(order: LiveOrder) -> dict[str, int]:
    return {t.request.request_id: t.layers_done for t in order.tasks}


def test_without_a_plan_every_task_runs_what_has_landed_and_the_head_is_relayed() -> None:
    order, _ = _order(landed_segments=1 + 3)  # embedding and layers 0..2
    for rid in ("a", "b"):
        order.add(_req(rid))
    _run_until_stuck(order)
    assert _stages(order) == {"a": 3, "b": 3}
    relayed = order.relay_head()
    assert relayed is not None and relayed.request_id == "a" and relayed.handoff is not None
    assert relayed.handoff.layer == 3


def test_a_task_stops_at_its_planned_layer_and_its_partner_takes_it_first() -> None:
    order, _ = _order(landed_segments=1 + 3)
    for rid in ("a", "b", "c"):
        order.add(_req(rid))
    order.plan({"a": LAYERS, "b": 1, "c": 0, "elsewhere": 2})
    assert "elsewhere" not in order.caps  # (a task not here is ignored)
    _run_until_stuck(order)
    assert _stages(order) == {"a": 3, "b": 1, "c": 0}
    first = order.relay_head()  # b and c are parked at their layer: the oldest of them
    assert first is not None and first.request_id == "b" and first.handoff is not None
    assert first.handoff.layer == 1
    second = order.relay_head()
    assert second is not None and second.request_id == "c" and second.handoff is not None
    assert second.handoff.layer == 0 and second.handoff.hidden is None
    assert order.relay_head() is None  # a stays whole here while weights arrive


def test_a_task_planned_to_stay_is_not_handed_over_even_before_it_has_blocks() -> None:
    order, _ = _order(landed_segments=1)
    order.add(_req("a"))
    order.plan({"a": LAYERS})
    assert order.relay_head() is None
    order.plan({})  # a new plan without it: the greedy rule again
    r = order.relay_head()
    assert r is not None and r.request_id == "a"


def test_once_every_layer_has_landed_the_plan_holds_nothing_back() -> None:
    order, ready = _order(landed_segments=1 + 2)
    order.add(_req("a"))
    order.plan({"a": 1})
    _run_until_stuck(order)
    assert _stages(order) == {"a": 1}
    for s in range(3, LAYERS + 2):
        ready.add(s)
    finished: list[str] = []
    while batch := order.next_batch():
        stage = batch[0].stage
        if stage == order.head_stage:
            finished += [r.request_id for r in order.ran(batch, stage)]
        else:
            order.ran(batch, stage, order.layers(stage, loading=False))
    assert finished == ["a"] and not order.caps


def test_a_removed_task_leaves_the_plan() -> None:
    order, _ = _order(landed_segments=1)
    req = _req("a")
    order.add(req)
    order.plan({"a": 2})
    assert order.remove(req) and order.caps == {}
    assert not order.tasks and order.relay_head() is None
