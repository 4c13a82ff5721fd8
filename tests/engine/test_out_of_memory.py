"""A step that runs out of device memory preempts and retries smaller (engine/oom.py).

The out-of-memory error is raised where a GPU raises it, inside the forward of a real tiny
model (the same class: `torch.cuda.OutOfMemoryError is torch.OutOfMemoryError`); every test
compares with the same engine run without it (greedy), checks the KV books after every
step, and checks that the errors were raised and retried (so it cannot pass by never
running out of memory).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.engine.oom import RECOVER_STEPS
from blitzscale.engine.overlap import PENDING
from blitzscale.engine.steptrace import StepTrace

CFG = {"block_size": 8, "num_kv_blocks": 64, "max_num_batched_tokens": 64, "max_num_seqs": 8}


def _engine(weights: Any, overlap: str = "off") -> LLMEngine:
    return LLMEngine(weights, None, EngineConfig(overlap=overlap, **CFG))


def _requests(vocab: int) -> list[tuple[str, list[int], SamplingParams]]:
    rng = random.Random(29)
    out = []
    for i, (n, m) in enumerate([(5, 12), (30, 9), (17, 20), (3, 6), (44, 15), (9, 25)]):
        prompt = [rng.randrange(2, vocab) for _ in range(n)]
        out.append((f"r{i}", prompt, SamplingParams(max_tokens=m, temperature=0, ignore_eos=True)))
    return out


def _run(engine: LLMEngine, requests: list[tuple[str, list[int], SamplingParams]]) -> dict[str, Any]:
    """Every request to its end; its final output, checked to add up and never pending."""
    for rid, prompt, params in requests:
        engine.add_request(prompt, params, request_id=rid)
    final: dict[str, Any] = {}
    streamed: dict[str, list[int]] = {}
    steps = 0
    while engine.has_unfinished():
        for o in engine.step():
            assert PENDING not in o.new_token_ids, o
            streamed.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.finished:
                assert o.request_id not in final, f"{o.request_id} finished twice"
                final[o.request_id] = o
        engine.check_integrity()
        for r in engine.scheduler.running:  # (no block left over from a step that failed)
            assert len(r.block_ids) == engine.pool.blocks_for_tokens(r.num_computed_tokens), r
        steps += 1
        assert steps < 3000, "the engine never finished"
    assert engine.is_idle and engine.pool.num_used_blocks == 0
    for rid, o in final.items():
        assert streamed[rid] == o.token_ids, f"{rid}: tokens lost or sent twice"
    return final


def _oom_when(engine: LLMEngine, monkeypatch: pytest.MonkeyPatch, fail: Any) -> list[int]:
    """Make the model's forward raise torch.OutOfMemoryError when `fail(tokens)` says so
    (after the layers ran, or before, in turn: with the KV of the failed step written or
    not). Returns the list of step sizes that raised."""
    run_layers = engine.model.run_layers
    raised: list[int] = []

    def forward(hidden: torch.Tensor, *args: Any, **kw: Any) -> torch.Tensor:
        n = hidden.shape[0]
        if not fail(n):
            return run_layers(hidden, *args, **kw)
        raised.append(n)
        if len(raised) % 2:
            run_layers(hidden, *args, **kw)  # the KV of the failed step is in the cache
        raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {n} MiB (injected)")

    monkeypatch.setattr(engine.model, "run_layers", forward)
    return raised


def _preemptions(engine: LLMEngine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    schedule, seen = engine.scheduler.schedule, [0]

    def counting() -> Any:
        out = schedule()
        seen[0] += out.num_preempted
        return out

    monkeypatch.setattr(engine.scheduler, "schedule", counting)
    return seen


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_big_steps_out_of_memory_serve_every_request(
    tiny_weights: Any, monkeypatch: pytest.MonkeyPatch, overlap: str
) -> None:
    """Six requests at once; the first eight steps of more than 4 tokens that run run out
    of memory (without overlap the first prefill, then smaller ones, then decode batches;
    with it, steps launched while the one before is in flight; the cap keeps most later
    steps under 4 tokens): every request gets the tokens it gets without the errors, the
    retries are counted, rows were preempted."""
    weights = tiny_weights("tiny-mistral")
    reqs = _requests(weights.config.vocab_size)
    want = {rid: o.token_ids for rid, o in _run(_engine(weights, overlap), reqs).items()}

    e = _engine(weights, overlap)
    budget = [8]

    def fail(n: int) -> bool:
        # with overlap, only while a step is in flight (its tokens must not be lost)
        if n > 4 and budget[0] > 0 and (overlap == "off" or (e.overlap.busy and e.overlap.steps >= 3)):
            budget[0] -= 1
            return True
        return False

    raised = _oom_when(e, monkeypatch, fail)
    preempted = _preemptions(e, monkeypatch)
    got = _run(e, reqs)
    # (without overlap the first is the first prefill; with it the cap, once set, keeps
    # every later step from overlapping until the requests are done)
    assert len(raised) >= 3 and raised[0] == 64 if overlap == "off" else len(raised) == 1
    assert all(o.finish_reason == "length" and not o.error for o in got.values()), got
    assert {rid: o.token_ids for rid, o in got.items()} == want
    assert e.backoff.retries == len(raised) == e.counts()["oom_retries"] and e.backoff.failures == 0
    assert preempted[0] > 0, "no running request was preempted to make the step smaller"
    if overlap == "on":
        assert e.overlap is not None and e.overlap.steps > 0  # (it did overlap)


def test_the_cap_recovers(tiny_weights: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One out-of-memory error caps the steps; after steps that fit the cap doubles and
    goes, so later steps are as large as configured again. The step trace marks the step
    that failed, which computed nothing (it is not paced)."""
    weights = tiny_weights("tiny-mistral")
    e = _engine(weights)
    e.trace = StepTrace(str(tmp_path / "trace"), torch.device("cpu"))
    raised = _oom_when(e, monkeypatch, lambda n: n > 12 and not e.backoff.retries)
    sizes: list[tuple[Any, int, int]] = []  # (the cap, rows, tokens) of each step
    schedule = e.scheduler.schedule

    def recording() -> Any:
        cap, out = e.scheduler.cap, schedule()
        sizes.append((cap, len(out.scheduled), sum(s.num_new_tokens for s in out.scheduled)))
        return out

    monkeypatch.setattr(e.scheduler, "schedule", recording)
    params = SamplingParams(max_tokens=4 * RECOVER_STEPS, temperature=0, ignore_eos=True)
    for i in range(8):
        e.add_request([3 + i] * 5, params, request_id=f"r{i}")
    first = e.step()
    assert raised == [40] and not first and e.scheduler.cap is not None
    assert e.last_work.oom and e.last_work.is_empty
    assert e.scheduler.cap.seqs == 4 and e.scheduler.cap.tokens == 20
    while e.scheduler.cap is not None:
        e.step()
        e.check_integrity()
        assert len(sizes) < 100, "the cap never went"
    e.step()
    capped = [(cap, rows, tokens) for cap, rows, tokens in sizes if cap is not None]
    assert all(rows <= cap.seqs and tokens <= cap.tokens for cap, rows, tokens in capped)
    assert any(rows == 4 for _, rows, _ in capped[1:])
    assert sizes[-1][1] == 8, "the steps did not grow back to the whole batch"
    lines = [json.loads(x) for x in e.trace.path.read_text().splitlines()[1:]]
    assert [x["oom"] for x in lines[:2]] == [True, False] and not any(x["oom"] for x in lines[1:])


def test_a_request_that_never_fits_fails_alone(tiny_weights: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step with request r4 in it runs out of memory, down to one token of it alone:
    r4 fails with an error naming memory, the other five are served as without errors."""
    weights = tiny_weights("tiny-mistral")
    reqs = _requests(weights.config.vocab_size)
    want = {rid: o.token_ids for rid, o in _run(_engine(weights), reqs).items()}

    e = _engine(weights)
    execute = e.runner.execute

    def oom_with_r4(sched: Any, in_flight: Any = None) -> torch.Tensor:
        if any(s.request.request_id == "r4" for s in sched.scheduled):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (injected)")
        return execute(sched, in_flight)

    monkeypatch.setattr(e.runner, "execute", oom_with_r4)
    got = _run(e, reqs)
    assert got["r4"].finish_reason == "error" and "out of device memory" in got["r4"].error
    assert "Tried to allocate 20.00 GiB" in got["r4"].error
    assert {rid: o.token_ids for rid, o in got.items() if rid != "r4"} == {
        rid: t for rid, t in want.items() if rid != "r4"
    }
    assert all(o.finish_reason == "length" for rid, o in got.items() if rid != "r4")
    assert e.backoff.failures == 1 and e.backoff.retries > 0
