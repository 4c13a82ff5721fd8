"""Requests that can never be served are refused up front with a message naming the problem,
and a refused request leaves no trace in the engine."""

from __future__ import annotations

import re

import pytest

from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.errors import BlitzScaleError, InvalidRequestError

MAX_LEN = 64


@pytest.fixture
def engine(tiny_weights) -> LLMEngine:
    cfg = EngineConfig(block_size=16, num_kv_blocks=8, max_model_len=MAX_LEN)
    return LLMEngine(tiny_weights("tiny-llama3"), None, cfg)


def refused(engine: LLMEngine, prompt: list[int], params: SamplingParams, match: str) -> str:
    with pytest.raises(InvalidRequestError, match=match) as err:
        engine.add_request(prompt, params)
    assert isinstance(err.value, BlitzScaleError) and isinstance(err.value, ValueError)
    assert not engine.request_ids() and engine.scheduler.num_unfinished == 0
    assert engine.pool.num_free_blocks == engine.pool.num_blocks
    return str(err.value)


def test_empty_prompt(engine: LLMEngine) -> None:
    refused(engine, [], SamplingParams(), "prompt is empty")


@pytest.mark.parametrize("max_tokens", [0, -1, -100])
def test_max_tokens_not_positive(engine: LLMEngine, max_tokens: int) -> None:
    msg = refused(engine, [5, 6], SamplingParams(max_tokens=max_tokens), "max_tokens")
    assert re.search(rf"got {max_tokens}\b", msg), msg


@pytest.mark.parametrize("n", [MAX_LEN, MAX_LEN + 1, 500])
def test_prompt_longer_than_context(engine: LLMEngine, n: int) -> None:
    msg = refused(engine, [5] * n, SamplingParams(max_tokens=1), "context")
    assert f"{n} tokens" in msg and str(MAX_LEN) in msg


def test_prompt_that_just_fits_is_accepted(engine: LLMEngine) -> None:
    (out,) = engine.generate([[5] * (MAX_LEN - 1)], SamplingParams(max_tokens=10, temperature=0))
    assert out.finish_reason == "length" and len(out.token_ids) == 1  # context is full


def test_context_is_capped_by_the_model(tiny_weights) -> None:
    weights = tiny_weights("tiny-mistral")  # max_position_embeddings = 1024
    engine = LLMEngine(weights, None, EngineConfig(block_size=16, num_kv_blocks=128, max_model_len=100_000))
    assert engine.max_model_len == 1024
    with pytest.raises(InvalidRequestError, match="1024"):
        engine.add_request([5] * 1024, SamplingParams(max_tokens=1))


def test_request_bigger_than_the_whole_cache(tiny_weights) -> None:
    engine = LLMEngine(tiny_weights("tiny-llama3"), None, EngineConfig(block_size=16, num_kv_blocks=2))
    msg = refused(engine, [5] * 20, SamplingParams(max_tokens=20), "KV blocks")
    assert re.search(r"\b3\b", msg) and re.search(r"\b2\b", msg), msg  # needs 3, holds 2


@pytest.mark.parametrize("bad", [-1, 700, 10**9])
def test_token_id_outside_vocabulary_is_named(engine: LLMEngine, bad: int) -> None:
    msg = refused(engine, [5, bad, 6], SamplingParams(), "vocabulary")
    assert str(bad) in msg, f"the message should name the bad token id {bad}: {msg}"


def test_a_stop_token_id_outside_the_vocabulary_is_named(engine: LLMEngine) -> None:
    """(it could never be generated: refused rather than ignored)"""
    msg = refused(engine, [5], SamplingParams(stop_token_ids=(3, 999999)), "stop_token_ids")
    assert "999999" in msg and "vocabulary" in msg, msg


@pytest.mark.parametrize(
    ("params", "named"),
    [
        (SamplingParams(top_p=0.0), "top_p"),
        (SamplingParams(top_p=1.5), "top_p"),
        (SamplingParams(top_p=-0.2), "top_p"),
        (SamplingParams(temperature=-0.5), "temperature"),
        (SamplingParams(top_k=-2), "top_k"),
    ],
)
def test_bad_sampling_parameter_is_named_with_its_value(
    engine: LLMEngine, params: SamplingParams, named: str
) -> None:
    value = getattr(params, named)
    msg = refused(engine, [5], params, named)
    assert str(value) in msg, msg


def test_empty_stop_string(engine: LLMEngine) -> None:
    refused(engine, [5], SamplingParams(stop=("ok", "")), "stop strings must not be empty")


def test_duplicate_request_id(engine: LLMEngine) -> None:
    engine.add_request([5], SamplingParams(), request_id="mine")
    with pytest.raises(InvalidRequestError, match="'mine'"):
        engine.add_request([6], SamplingParams(), request_id="mine")
    assert engine.request_ids() == ["mine"]


def test_aborting_unknown_or_finished_requests_is_a_no_op(engine: LLMEngine) -> None:
    assert engine.abort("no-such-request") is False
    (out,) = engine.generate([[5, 6]], SamplingParams(max_tokens=2))
    assert engine.abort(out.request_id) is False
    assert engine.step() == []


def test_bad_engine_config() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        EngineConfig(block_size=0)
    for kw in ({"max_num_batched_tokens": -1}, {"max_num_seqs": -1}):
        with pytest.raises(ValueError, match=r"must be >= 0 \(0: sized for the device\), got -?\d+/-?\d+"):
            EngineConfig(**kw)


def test_step_limits_left_at_zero_are_the_devices() -> None:
    """0 is "sized for the device": a GPU takes vLLM's large-GPU limits, a CPU smaller ones;
    a value given is kept."""
    assert EngineConfig().for_device("cuda") == EngineConfig(max_num_batched_tokens=8192, max_num_seqs=256)
    assert EngineConfig().for_device("cuda:1").max_num_seqs == 256
    assert EngineConfig().for_device("cpu") == EngineConfig(max_num_batched_tokens=2048, max_num_seqs=64)
    assert EngineConfig(max_num_seqs=8).for_device("cuda").max_num_seqs == 8


def test_generate_with_one_bad_prompt_queues_none_of_them(engine: LLMEngine) -> None:
    """A batch with a bad prompt is refused as a whole: the good prompts before it must not
    be left queued in the engine, running with nobody to collect their outputs."""
    with pytest.raises(InvalidRequestError, match="prompt is empty"):
        engine.generate([[5, 6], [7], []], SamplingParams(max_tokens=4))
    assert not engine.has_unfinished()
    assert engine.scheduler.num_unfinished == 0
    assert engine.step() == []
