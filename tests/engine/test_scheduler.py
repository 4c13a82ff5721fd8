"""The scheduler on its own: a BlockPool and Requests, no model.

`advance` plays the engine's part after each step: computed tokens move forward and every
request whose prompt is complete gets one new token.
"""

from __future__ import annotations

from blitzscale.core.sampling import SamplingParams
from blitzscale.engine.request import Request, RequestStatus
from blitzscale.engine.scheduler import Scheduler, SchedulerOutput
from blitzscale.kvcache import BlockPool


def make_request(rid: str, prompt_len: int, max_tokens: int = 100) -> Request:
    return Request(rid, list(range(2, 2 + prompt_len)), SamplingParams(max_tokens=max_tokens))


def advance(out: SchedulerOutput) -> None:
    sampling = [s.request for s in out.scheduled if s.completes_prompt]
    for s in out.scheduled:
        s.request.num_computed_tokens += s.num_new_tokens
    for r in sampling:
        r.token_ids.append(7)


def step(sched: Scheduler) -> dict[str, int]:
    """Run one schedule + advance; the new tokens each request got, by id."""
    out = sched.schedule()
    got = {s.request.request_id: s.num_new_tokens for s in out.scheduled}
    assert len(got) == len(out.scheduled), "a request was scheduled twice in one step"
    advance(out)
    return got


def test_chunked_prefill_respects_the_token_budget() -> None:
    sched = Scheduler(BlockPool(64, 4), max_num_batched_tokens=10, max_num_seqs=8)
    a, b = make_request("a", 25), make_request("b", 7)
    sched.add(a)
    sched.add(b)
    history = []
    for _ in range(6):
        out = sched.schedule()
        assert sum(s.num_new_tokens for s in out.scheduled) <= 10
        history.append({s.request.request_id: (s.num_new_tokens, s.completes_prompt) for s in out.scheduled})
        advance(out)
    assert history[0] == {"a": (10, False)}
    assert history[1] == {"a": (10, False)}
    assert history[2] == {"a": (5, True), "b": (5, False)}
    assert history[3] == {"a": (1, True), "b": (2, True)}
    assert history[4] == {"a": (1, True), "b": (1, True)}
    assert a.num_computed_tokens == 28 and a.num_output_tokens == 4
    assert b.num_computed_tokens == 9 and b.num_output_tokens == 3


def test_prompt_longer_than_budget_is_prefilled_in_budget_sized_chunks() -> None:
    sched = Scheduler(BlockPool(64, 16), max_num_batched_tokens=16, max_num_seqs=8)
    r = make_request("r", 50)
    sched.add(r)
    assert [step(sched)["r"] for _ in range(5)] == [16, 16, 16, 2, 1]
    assert len(r.block_ids) == 4  # 51 computed tokens


def test_every_running_request_decodes_each_step() -> None:
    sched = Scheduler(BlockPool(64, 4), max_num_batched_tokens=64, max_num_seqs=8)
    reqs = [make_request(f"r{i}", 3 + i) for i in range(5)]
    for r in reqs:
        sched.add(r)
    assert step(sched) == {r.request_id: r.num_prompt_tokens for r in reqs}
    for _ in range(6):
        assert step(sched) == {r.request_id: 1 for r in reqs}
    assert all(r.num_output_tokens == 7 for r in reqs)


def test_max_num_seqs_caps_running_requests() -> None:
    sched = Scheduler(BlockPool(64, 4), max_num_batched_tokens=64, max_num_seqs=3)
    reqs = [make_request(f"r{i}", 4) for i in range(5)]
    for r in reqs:
        sched.add(r)
    assert set(step(sched)) == {"r0", "r1", "r2"}
    assert [r.request_id for r in sched.waiting] == ["r3", "r4"]
    sched.finish(reqs[1], "stop")
    assert set(step(sched)) == {"r0", "r2", "r3"}


def test_requests_queue_while_blocks_run_out() -> None:
    pool = BlockPool(4, 4)
    sched = Scheduler(pool, max_num_batched_tokens=64, max_num_seqs=8)
    a, b, c = make_request("a", 7), make_request("b", 7), make_request("c", 3)
    for r in (a, b, c):
        sched.add(r)
    out = sched.schedule()
    assert [s.request.request_id for s in out.scheduled] == ["a", "b"]
    assert out.num_preempted == 0
    assert pool.num_free_blocks == 0
    assert c.status is RequestStatus.WAITING and not c.block_ids
    advance(out)
    assert step(sched) == {"a": 1, "b": 1}  # 8 tokens each: still two blocks each
    assert list(sched.waiting) == [c]
    sched.finish(a, "stop")
    assert pool.num_free_blocks == 2
    assert step(sched) == {"b": 1, "c": 3}
    assert c.status is RequestStatus.RUNNING


def test_preemption_frees_the_newest_request_and_requeues_it_first() -> None:
    pool = BlockPool(4, 4)
    sched = Scheduler(pool, max_num_batched_tokens=64, max_num_seqs=8)
    a, b, c = make_request("a", 8), make_request("b", 8), make_request("c", 2)
    for r in (a, b, c):
        sched.add(r)
    assert step(sched) == {"a": 8, "b": 8}  # pool full, c queued
    out = sched.schedule()  # a's 9th token needs a third block: b must give its blocks back
    assert out.num_preempted == 1
    assert [s.request.request_id for s in out.scheduled] == ["a"]
    assert b.status is RequestStatus.WAITING and not b.block_ids
    assert b.num_computed_tokens == 0 and b.num_output_tokens == 1  # its output is kept
    assert list(sched.waiting) == [b, c]  # preempted request goes first
    assert sched.running == [a] and len(a.block_ids) == 3
    assert pool.num_used_blocks == 3
    advance(out)
    sched.finish(a, "stop")
    assert pool.num_free_blocks == 4
    assert step(sched) == {"b": 9, "c": 2}  # recomputes prompt and output, then c
    assert b.num_output_tokens == 2


def test_finish_returns_blocks_of_running_and_waiting_requests() -> None:
    pool = BlockPool(8, 4)
    sched = Scheduler(pool, max_num_batched_tokens=64, max_num_seqs=1)
    a, b = make_request("a", 10), make_request("b", 3)
    sched.add(a)
    sched.add(b)
    step(sched)
    assert pool.num_used_blocks == 3
    sched.finish(b, "abort")  # still waiting
    assert b.status is RequestStatus.FINISHED and b.finish_reason == "abort"
    sched.finish(a, "length")
    assert a.finish_reason == "length" and not a.block_ids
    assert pool.num_free_blocks == 8
    assert sched.num_unfinished == 0
    assert sched.schedule().is_empty
