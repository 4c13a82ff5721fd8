"""A request run again (its instance died before it produced anything) is a new request to
the workers: what is left of the last run on a surviving worker keeps the old id, so the
rerun is never refused as "already in use" and late messages of the old run are ignored."""

from __future__ import annotations

from types import SimpleNamespace

from blitzscale.core.sampling import SamplingParams
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
