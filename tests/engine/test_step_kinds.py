"""The engine says what each step was (engine/work.py): the kinds a worker tallies for
`/metrics` and `bench serve` to show where step time goes."""

from __future__ import annotations

from typing import Any

from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.engine.work import StepTally, StepWork, kinds_between


def _engine(weights: Any, overlap: str = "off") -> LLMEngine:
    cfg = EngineConfig(block_size=16, num_kv_blocks=128, max_num_seqs=8, max_model_len=256, overlap=overlap)
    return LLMEngine(weights, None, cfg)


def test_prefill_decode_and_mixed_steps_are_told_apart(tiny_weights: Any) -> None:
    e = _engine(tiny_weights("tiny-llama3"))
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    tally = StepTally()
    kinds = []

    def step() -> None:
        e.step()
        kinds.append(e.last_work.kind)
        tally.add(e.last_work, 0.5)

    e.add_request(list(range(1, 21)), params)
    step()  # the prompt alone
    step()  # one decode row
    e.add_request(list(range(1, 11)), params)
    step()  # the new prompt beside the first request's decode row
    while e.has_unfinished():
        step()
    assert kinds[:3] == ["prefill_eager", "decode_eager", "mixed_eager"]  # (no CUDA graphs on CPU)
    assert set(kinds[3:]) <= {"decode_eager", "none"}
    mixed = tally.kinds["mixed_eager"]
    assert (mixed.steps, mixed.tokens, mixed.seconds) == (1, 11, 0.5)  # 10 prompt tokens + 1 row
    assert tally.kinds["prefill_eager"].tokens == 20
    summary = kinds_between(StepTally(), tally)
    want = {"steps": 1, "ms_per_step": 500.0, "overlapped_share": 0.0, "tokens_per_step": 11.0}
    assert summary["mixed_eager"] == want
    assert "live" not in summary  # kinds that did not run are left out


def test_overlapped_decode_steps_are_counted(tiny_weights: Any) -> None:
    e = _engine(tiny_weights("tiny-llama3"), overlap="on")
    e.add_request(list(range(1, 21)), SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    tally = StepTally()
    while e.has_unfinished():
        e.step()
        tally.add(e.last_work, 0.0)
    dec = tally.kinds["decode_eager"]
    assert dec.steps >= 5 and 0 < dec.overlapped <= dec.steps


def test_step_kind_of_live_work() -> None:
    assert StepWork(partial=[(8, 0.5)], decode_contexts=[3]).kind == "live"
    assert StepWork(decode_contexts=[3], graph=True).kind == "decode_graph"
    assert StepWork(prompt_tokens=9, decode_contexts=[3], graph=True).kind == "mixed_graph"
    assert StepWork(prompt_tokens=9, graph=True).kind == "prefill_graph"
    assert StepWork().kind == "none"


def test_the_step_trace_writes_a_line_per_step_with_its_chunks(tiny_weights: Any, tmp_path: Any) -> None:
    """BLITZSCALE_STEP_TRACE's lines (engine/steptrace.py): one per step, in order, saying
    what the step computed; a chunk continuing a prefix is counted as one."""
    import itertools
    import json

    import torch

    from blitzscale.engine.steptrace import StepTrace

    cfg = EngineConfig(block_size=16, num_kv_blocks=128, max_num_batched_tokens=32, max_model_len=256)
    e = LLMEngine(tiny_weights("tiny-llama3"), None, cfg)
    e.trace = StepTrace(str(tmp_path / "t"), torch.device("cpu"))
    e.add_request(list(range(1, 41)), SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    while e.has_unfinished():
        e.step()
    [path] = tmp_path.glob("t.*.jsonl")
    head, *lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert head["process"] and head["torch_threads"] >= 1 and "MainThread" in head["python_threads"]
    assert head["driver_module_loading"] is None  # (asked of the driver on CUDA only)
    assert [(x["kind"], x["prompt_tokens"], x["chunks"], x["prefixed_chunks"]) for x in lines[:2]] == [
        ("prefill_eager", 32, 1, 0),
        ("prefill_eager", 8, 1, 1),  # the rest of the 40-token prompt, after its first 32
    ]
    assert [x["kind"] for x in lines[2:]] == ["decode_eager"] * (len(lines) - 2) and len(lines) >= 4
    assert all(x["wall_ms"] >= x["launch_ms"] >= 0 and x["device_ms"] is None for x in lines)
    assert all(a["t"] < b["t"] for a, b in itertools.pairwise(lines))
