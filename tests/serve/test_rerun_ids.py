"""A request run again (its instance died before it produced anything) is a new request to
the workers: what is left of the last run on a surviving worker keeps the old id, so the
rerun is never refused as "already in use" and late messages of the old run are ignored."""

from __future__ import annotations

from types import SimpleNamespace

from blitzscale.engine.request import SamplingParams
from blitzscale.serve.requests import RouterRequest
from blitzscale.serve.router import Router


def test_a_rerun_has_a_new_wire_id_and_old_messages_find_nothing() -> None:
    r = RouterRequest(id="cmpl-1#x", prompt=[1, 2], params=SamplingParams())
    table = SimpleNamespace(reqs={r.id: r})
    assert r.wire_id == "cmpl-1#x"
    assert Router.request_of(table, "cmpl-1#x") is r  # type: ignore[arg-type]
    r.attempt += 1
    assert r.wire_id == "cmpl-1#x#1"
    assert Router.request_of(table, "cmpl-1#x#1") is r  # type: ignore[arg-type]
    assert Router.request_of(table, "cmpl-1#x") is None  # type: ignore[arg-type]  # the old run
    assert Router.request_of(table, "cmpl-1") is None  # type: ignore[arg-type]
    assert Router.request_of(table, "other#1") is None  # type: ignore[arg-type]


def test_an_instance_that_goes_inactive_forgets_its_engine_numbers() -> None:
    """A dead (or released) engine's last stats must not count as KV still in use, nor make
    the instance look busy, once the rank is back (respawned) and holds nothing."""
    from blitzscale.control.snapshot import InstanceState
    from blitzscale.messages import StatsMsg
    from blitzscale.serve.instances import Instance

    inst = Instance(id=0, ranks=(0,))
    inst.set_state(InstanceState.LOADING)
    inst.set_state(InstanceState.COLOCATED)
    inst.stats = StatsMsg(rank=0, num_running=3, num_waiting=0, num_held=0, used_blocks=58, total_blocks=256)
    assert not inst.is_idle
    inst.set_state(InstanceState.INACTIVE, "(worker died)")
    assert inst.stats is None and inst.is_idle and inst.view().used_blocks == 0
