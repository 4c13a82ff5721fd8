"""The engine's one request table: checked statuses, one release path, and a serving loop
that talks to the engine through its methods only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import blitzscale
from blitzscale.core.sampling import SamplingParams
from blitzscale.engine.request import Request, RequestStatus
from blitzscale.engine.table import TRANSITIONS, RequestStateError, RequestTable
from blitzscale.errors import InvalidRequestError, KVIntegrityError
from blitzscale.kvcache import BlockPool

S = RequestStatus


def _req(rid: str) -> Request:
    return Request(rid, [1, 2, 3], SamplingParams())


def test_moves_outside_the_state_machine_are_refused() -> None:
    t = RequestTable(BlockPool(8, 4))
    a = _req("a")
    with pytest.raises(RequestStateError):
        t.add(a, S.RUNNING)  # requests enter waiting, live, importing or relayed in
    t.add(a, S.WAITING)
    with pytest.raises(InvalidRequestError, match="'a'"):
        t.add(_req("a"), S.IMPORTING)
    for bad in (S.HELD, S.RELAYING, S.IMPORTING):
        with pytest.raises(RequestStateError):
            t.move(a, bad)
    t.move(a, S.RUNNING)
    t.move(a, S.HELD)
    with pytest.raises(RequestStateError):
        t.move(a, S.WAITING)  # a held request is adopted (running) or released
    with pytest.raises(RequestStateError):
        t.move(_req("stranger"), S.RUNNING)
    assert all(S.FINISHED in nxt for s, nxt in TRANSITIONS.items() if s is not S.FINISHED)


def test_release_is_the_one_path_that_frees_blocks_and_happens_once() -> None:
    pool = BlockPool(8, 4)
    t = RequestTable(pool)
    a = _req("a")
    t.add(a, S.IMPORTING)
    a.block_ids = pool.allocate(3)
    assert t.problems() == []
    t.release(a, "abort")
    assert a.status is S.FINISHED and a.finish_reason == "abort" and not a.block_ids
    assert pool.num_free_blocks == 8 and "a" not in t and len(t) == 0
    t.release(a, "stop")  # twice: nothing happens
    assert a.finish_reason == "abort" and pool.num_free_blocks == 8


def test_table_problems_name_leaks_and_shared_blocks() -> None:
    pool = BlockPool(8, 4)
    t = RequestTable(pool)
    a, b = _req("a"), _req("b")
    t.add(a, S.WAITING)
    t.add(b, S.LIVE)
    a.block_ids = pool.allocate(2)
    b.block_ids = [a.block_ids[0]]
    assert any("not a cached prefix" in p for p in t.problems())
    b.block_ids = []
    pool.allocate(1)
    assert any("leaked" in p for p in t.problems())


def test_engine_integrity_sees_a_queue_that_disagrees_with_the_table(tiny_weights) -> None:
    from blitzscale.engine import EngineConfig, LLMEngine

    e = LLMEngine(tiny_weights("tiny-llama3"), None, EngineConfig(block_size=4, num_kv_blocks=32))
    rid = e.add_request([1, 2, 3], SamplingParams(max_tokens=4, temperature=0))
    e.step()
    e.check_integrity()
    req = e.request(rid)
    assert req is not None and req.status is S.RUNNING
    e.scheduler.running.remove(req)  # a request the batch lost track of
    with pytest.raises(KVIntegrityError, match="running"):
        e.check_integrity()
    e.scheduler.running.append(req)
    e.check_integrity()
    counts = e.counts()
    assert counts["running"] == 1 and counts["used_blocks"] == 1 and counts["total_blocks"] == 32


ENGINE_INSIDES = {"scheduler", "pool", "kv_cache", "table", "live", "runner", "outputs"}


def test_the_serving_loop_uses_the_engine_api_not_its_insides() -> None:
    """worker/serving.py and worker/relays.py reach the engine (`e`, `engine`,
    `self.engine`, `self.loop.engine`) through its methods and those of its KV hand-offs
    (`e.handoffs`), never their components."""
    root = Path(blitzscale.__file__).parent / "worker"
    offenders = []
    for name in ("serving.py", "relays.py"):
        for node in ast.walk(ast.parse((root / name).read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ENGINE_INSIDES and _is_engine(node.value):
                offenders.append(f"{name}:{node.lineno} .{node.attr}")
    assert not offenders, offenders


def _is_engine(v: ast.expr) -> bool:
    if isinstance(v, ast.Name):
        return v.id in ("e", "engine")
    if isinstance(v, ast.Attribute) and v.attr == "handoffs":
        return _is_engine(v.value)
    return isinstance(v, ast.Attribute) and v.attr == "engine"


def test_an_aborted_id_stays_in_use_until_its_last_output_went_out(tiny_weights) -> None:
    """Otherwise a new request under that id would receive the old one's abort output."""
    from blitzscale.engine import EngineConfig, LLMEngine

    e = LLMEngine(tiny_weights("tiny-llama3"), None, EngineConfig(block_size=4, num_kv_blocks=32))
    params = SamplingParams(max_tokens=4, temperature=0)
    e.add_request([1, 2, 3], params, request_id="x")
    assert e.abort("x")
    with pytest.raises(InvalidRequestError, match="'x'"):
        e.add_request([4, 5], params, request_id="x")
    with pytest.raises(InvalidRequestError, match="'x'"):
        e.handoffs.reserve_import("x", [1, 2, 3, 9], 3, params)
    outs = e.step()
    assert [(o.request_id, o.finish_reason) for o in outs] == [("x", "abort")]
    e.add_request([4, 5], params, request_id="x")  # free again
