"""A worker's serving loop when one request breaks its engine step: that request fails with
an error (finish_reason "error"), the others go on, and the loop keeps serving."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from blitzscale.core.config import EngineConfig
from blitzscale.core.sampling import SamplingParams
from blitzscale.messages import ActivateMsg, GenerateMsg, Message, OutputMsg, OutputsMsg, sampling_msg
from blitzscale.worker.serving import ServingLoop


class Loop:
    """A ServingLoop on the real SmolLM2, driven by hand; every message it sends is kept."""

    def __init__(self, weights: Any, tokenizer: Any) -> None:
        self.sent: list[Message] = []
        self.serving = ServingLoop(0, None, self.sent.append, lambda *a: None)
        engine = EngineConfig(block_size=16, num_kv_blocks=64, max_model_len=2048)
        msg = ActivateMsg(op_id=1, model="m", source="smollm2-135m", role="colocated", engine=engine)
        self.serving.activate(weights, tokenizer, msg)
        self.tokenizer = tokenizer

    def submit(self, rid: str, prompt: str, params: SamplingParams) -> None:
        ids = self.tokenizer(prompt).input_ids
        self.serving.handle(GenerateMsg(request_id=rid, prompt_token_ids=ids, params=sampling_msg(params)))

    def tokens(self, rid: str) -> list[int]:
        return [
            t
            for m in self.sent
            if isinstance(m, OutputsMsg)
            for o in m.outputs
            if o.request_id == rid
            for t in o.new_token_ids
        ]

    def run(self, max_ticks: int = 500) -> dict[str, OutputMsg]:
        """Tick until idle; the last output of each request."""
        for _ in range(max_ticks):
            if not self.serving.tick():
                break
        assert self.serving.is_idle
        last: dict[str, OutputMsg] = {}
        for m in self.sent:
            if isinstance(m, OutputsMsg):
                last.update({o.request_id: o for o in m.outputs})
        return last


@pytest.fixture
def loop(smollm2_weights: Any, smollm2_tokenizer: Any) -> Loop:
    return Loop(smollm2_weights, smollm2_tokenizer)


GREEDY = SamplingParams(max_tokens=6, temperature=0)
SAMPLED = SamplingParams(max_tokens=6, temperature=0.8, seed=7)


def test_non_finite_logits_fail_only_that_request(loop: Loop, monkeypatch) -> None:
    e = loop.serving.engine
    assert e is not None
    real = e.runner.execute
    poisoned = {"done": False}

    def execute(sched: Any, *rest: Any) -> torch.Tensor:
        logits = real(sched, *rest).clone()
        rows = [s.request.request_id for s in sched.scheduled if s.completes_prompt]
        if not poisoned["done"] and "bad" in rows:  # as a bf16 overflow would
            logits[rows.index("bad")] = float("nan")
            poisoned["done"] = True
        return logits

    monkeypatch.setattr(e.runner, "execute", execute)
    loop.submit("good", "The capital of France is", SAMPLED)
    loop.submit("bad", "def fibonacci(n):", SAMPLED)
    loop.submit("greedy", "Once upon a time", GREEDY)
    last = loop.run()
    assert last["bad"].finished and last["bad"].finish_reason == "error"
    assert "non-finite" in last["bad"].error
    for rid in ("good", "greedy"):
        assert last[rid].finished and last[rid].finish_reason == "length"
        assert last[rid].num_output_tokens == 6
    assert e.pool.num_used_blocks == 0


def test_a_step_that_raises_fails_its_requests_and_the_loop_serves_on(loop: Loop, monkeypatch) -> None:
    e = loop.serving.engine
    assert e is not None
    error = RuntimeError("CUDA error: an illegal memory access was encountered")
    _fail_steps(monkeypatch, e, lambda n: n == 2, error)  # the second: both requests running
    loop.submit("a", "The capital of France is", GREEDY)
    loop.submit("b", "def fibonacci(n):", GREEDY)
    last = loop.run()
    for rid in ("a", "b"):
        assert last[rid].finish_reason == "error"
        assert "illegal memory access" in last[rid].error and "rank 0" in last[rid].error
    assert e.pool.num_used_blocks == 0
    loop.sent.clear()
    loop.submit("after", "The capital of France is", GREEDY)
    after = loop.run()["after"]
    assert after.finish_reason == "length" and after.num_output_tokens == 6


def test_out_of_memory_in_a_step_serves_its_requests(loop: Loop, monkeypatch) -> None:
    """The step issue 29 saw fail every request with 'CUDA out of memory': retried smaller
    by the engine (engine/oom.py), both requests get what they get without it, the stats
    the router reads count it, and nothing fails."""
    loop.submit("a", "The capital of France is", GREEDY)
    loop.submit("b", "def fibonacci(n):", GREEDY)
    loop.run()
    want = {rid: loop.tokens(rid) for rid in ("a", "b")}
    loop.sent.clear()
    e = loop.serving.engine
    assert e is not None
    oom = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    calls = _fail_steps(monkeypatch, e, lambda n: n <= 2, oom)  # both prefills, then the smaller retry
    loop.submit("a", "The capital of France is", GREEDY)
    loop.submit("b", "def fibonacci(n):", GREEDY)
    last = loop.run()
    for rid in ("a", "b"):
        assert last[rid].finish_reason == "length" and not last[rid].error, last[rid]
        assert loop.tokens(rid) == want[rid]
    assert loop.serving.stats().oom_retries == 2 and calls["n"] > 2
    assert e.pool.num_used_blocks == 0


@pytest.mark.parametrize("temperature", [1e-40, 1e-30, 5e-6])
def test_temperatures_too_small_to_divide_by_sample_greedily(loop: Loop, temperature: float) -> None:
    loop.submit("tiny", "The capital of France is", SamplingParams(max_tokens=6, temperature=temperature))
    loop.submit("greedy", "The capital of France is", GREEDY)
    last = loop.run()
    assert last["tiny"].finish_reason == last["greedy"].finish_reason == "length"
    assert loop.tokens("tiny") == loop.tokens("greedy")


def test_a_step_that_raises_half_way_still_reports_what_it_finished(loop: Loop, monkeypatch) -> None:
    e = loop.serving.engine
    assert e is not None
    real = e.outputs.check_stop

    def check_stop(req: Any) -> Any:
        if req.request_id == "second":
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "a detokenizer bug")
        return real(req)

    monkeypatch.setattr(e.outputs, "check_stop", check_stop)
    loop.submit("first", "The capital of France is", SamplingParams(max_tokens=1, temperature=0))
    loop.submit("second", "def fibonacci(n):", GREEDY)
    last = loop.run()
    assert last["first"].finished and last["first"].finish_reason == "length"  # not lost
    assert last["second"].finish_reason == "error" and "detokenizer" in last["second"].error
    assert e.pool.num_used_blocks == 0


def test_a_worker_whose_every_step_fails_gives_up(loop: Loop, monkeypatch) -> None:
    from blitzscale.worker.serving import MAX_FAILED_STEPS, WorkerBrokenError

    e = loop.serving.engine
    assert e is not None

    def broken(sched: Any) -> torch.Tensor:
        raise RuntimeError("CUDA error: unspecified launch failure")

    monkeypatch.setattr(e.runner, "execute", broken)
    with pytest.raises(WorkerBrokenError):
        for k in range(MAX_FAILED_STEPS):
            loop.submit(f"r{k}", "The capital of France is", GREEDY)
            loop.run()


def _fail_steps(monkeypatch: Any, e: Any, failing: Callable[[int], bool], error: Exception) -> dict[str, int]:
    """The engine's forward raises `error` at the steps (counted from 1) `failing` names;
    the count of its calls so far."""
    real = e.runner.execute
    calls = {"n": 0}

    def execute(sched: Any, *rest: Any) -> torch.Tensor:
        calls["n"] += 1
        if failing(calls["n"]):
            raise error
        return real(sched, *rest)

    monkeypatch.setattr(e.runner, "execute", execute)
    return calls
