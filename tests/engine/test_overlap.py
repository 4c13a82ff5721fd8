"""Overlapped decoding (engine/overlap.py) gives every request what it gets without it.

On CPU nothing runs ahead, but `overlap = "on"` runs the same bookkeeping as on a GPU: each
step is launched before the last one's tokens are read, pending tokens are taken from the
step in flight, a request that stopped gets one dropped row, and anything not plain makes
the engine read the step in flight first. Each test compares with an engine without it,
and checks that overlap did happen (so it cannot pass by never overlapping).
"""

from __future__ import annotations

from typing import Any

import pytest

from blitzscale.core.outputs import RequestOutput
from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.engine.overlap import PENDING


def _engine(weights: Any, tokenizer: Any, overlap: str, **kw: Any) -> LLMEngine:
    cfg = {"block_size": 16, "num_kv_blocks": 256, "max_num_seqs": 16, "max_model_len": 512, **kw}
    return LLMEngine(weights, tokenizer, EngineConfig(overlap=overlap, **cfg))


def _run(engine: LLMEngine, events: dict[int, list[tuple[str, Any]]]) -> dict[str, list[RequestOutput]]:
    """Step until done; before step k, apply events[k]: ("add", (id, prompt, params)) or
    ("abort", id). Every output by request, in order; no output holds a pending token."""
    outs: dict[str, list[RequestOutput]] = {}
    k = 0
    while k <= max(events, default=0) or engine.has_unfinished():
        for kind, arg in events.get(k, []):
            if kind == "add":
                rid, prompt, params = arg
                engine.add_request(prompt, params, request_id=rid)
            else:
                engine.abort(arg)
        for o in engine.step():
            assert PENDING not in o.token_ids and PENDING not in o.new_token_ids, o
            outs.setdefault(o.request_id, []).append(o)
        engine.check_integrity()
        k += 1
        assert k < 2000, "the engine never finished"
    assert engine.is_idle
    return outs


def _final(outs: dict[str, list[RequestOutput]]) -> dict[str, tuple[list[int], str, str | None]]:
    for rid, seq in outs.items():
        assert seq[-1].finished and not any(o.finished for o in seq[:-1]), rid
        streamed = [t for o in seq for t in o.new_token_ids]
        assert streamed == seq[-1].token_ids, f"{rid}: the deltas do not add up to the tokens"
        assert "".join(o.text_delta for o in seq) == seq[-1].text, rid
    return {rid: (seq[-1].token_ids, seq[-1].text, seq[-1].finish_reason) for rid, seq in outs.items()}


@pytest.fixture(scope="module")
def prompts(smollm2_tokenizer: Any) -> list[list[int]]:
    texts = ["The quick brown fox", "def fibonacci(n):", "Once upon a time", "1, 2, 3, 4,", "Paris is"]
    return [smollm2_tokenizer.encode(t) for t in texts]


def test_same_tokens_stops_and_text(
    smollm2_weights: Any, smollm2_tokenizer: Any, prompts: list[list[int]]
) -> None:
    """Greedy requests of different lengths and stop conditions (eos, a stop token that the
    model emits early, a stop string, max_tokens, the context limit), all arriving at once."""
    greedy = SamplingParams(max_tokens=20, temperature=0)
    params = [
        greedy,
        SamplingParams(max_tokens=20, temperature=0, stop=("\n",)),
        SamplingParams(max_tokens=7, temperature=0),
        SamplingParams(max_tokens=30, temperature=0, stop_token_ids=(28,)),  # "," in SmolLM2
        SamplingParams(max_tokens=64, temperature=0),  # hits max_model_len below
    ]
    events = {0: [("add", (f"r{i}", p, params[i])) for i, p in enumerate(prompts)]}
    results = {}
    for mode in ("off", "on"):
        e = _engine(smollm2_weights, smollm2_tokenizer, mode, max_model_len=40)
        results[mode] = _final(_run(e, events))
        if mode == "on":
            assert e.overlap is not None and e.overlap.steps >= 10
    assert results["on"] == results["off"]
    reasons = {r for _, _, r in results["on"].values()}
    assert reasons == {"stop", "length"}, reasons


def test_arrivals_aborts_and_seeded_requests(
    smollm2_weights: Any, smollm2_tokenizer: Any, prompts: list[list[int]]
) -> None:
    """Requests join while others decode (the step in flight is read first), a seeded
    sampled request joins (no overlap while it runs), and two are aborted mid-decode: their
    abort output holds only read tokens, a prefix of what they would have produced."""
    greedy = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    seeded = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True)
    events: dict[int, list[tuple[str, Any]]] = {
        0: [("add", ("a", prompts[0], greedy)), ("add", ("b", prompts[1], greedy))],
        4: [("add", ("c", prompts[2], greedy))],
        7: [("abort", "a")],
        9: [("add", ("s", prompts[3], seeded))],
        12: [("abort", "c")],
        14: [("add", ("d", prompts[4], greedy))],
    }
    results = {}
    for mode in ("off", "on"):
        e = _engine(smollm2_weights, smollm2_tokenizer, mode)
        results[mode] = _final(_run(e, events))
        if mode == "on":
            assert e.overlap is not None and e.overlap.steps >= 5
    on, off = results["on"], results["off"]
    for rid in ("b", "d", "s"):
        assert on[rid] == off[rid], rid
    alone = _final(_run(_engine(smollm2_weights, smollm2_tokenizer, "off"), {
        0: [("add", ("a", prompts[0], greedy)), ("add", ("c", prompts[2], greedy))]
    }))  # fmt: skip
    for rid in ("a", "c"):
        tokens, _, reason = on[rid]
        assert reason == "abort"
        assert tokens == alone[rid][0][: len(tokens)], rid


def test_a_failed_step_drops_the_tokens_in_flight(tiny_weights: Any) -> None:
    """A step that raises while another is in flight: its requests fail without a pending
    token in their output, and the engine serves the next request as usual."""
    w = tiny_weights("tiny-llama3")
    e = _engine(w, None, "on")
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    e.add_request([5, 6, 7], params, request_id="x")
    for _ in range(4):
        e.step()
    assert e.overlap is not None and e.overlap.busy
    real = e.runner.execute
    e.runner.execute = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("device lost"))  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        e.step()
    e.runner.execute = real  # type: ignore[method-assign]
    failed = e.fail_unfinished("boom")
    assert [o.request_id for o in failed] == ["x"] and failed[0].error == "boom"
    assert PENDING not in failed[0].token_ids
    e.check_integrity()
    again = e.generate([[5, 6, 7]], params)[0]
    ref = _engine(w, None, "off").generate([[5, 6, 7]], params)[0]
    assert again.token_ids == ref.token_ids
