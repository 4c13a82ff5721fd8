"""The new sampling parameters through the serving cluster in pd mode (CPU workers): the
prefill instance samples the first token, the KV and the seeded generator migrate, the
decode instance samples the rest. Each answer must equal one local engine's on the same
weights, so a parameter lost on the way (or applied on one side only) fails the test."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import httpx
import pytest

from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams

PROMPT = "Once upon a time, in a land far away, there lived a"
BODY = {
    "model": "smollm2-135m",
    "prompt": PROMPT,
    "max_tokens": 14,
    "temperature": 0.8,
    "seed": 5,
    "frequency_penalty": 0.9,
    "presence_penalty": 0.4,
    "repetition_penalty": 1.3,
    "logit_bias": {"28": -100},
    "min_tokens": 6,
    "logprobs": 3,
}


def local_params(**kw: Any) -> SamplingParams:
    base = SamplingParams(
        max_tokens=14, temperature=0.8, seed=5, frequency_penalty=0.9, presence_penalty=0.4,
        repetition_penalty=1.3, logit_bias=((28, -100.0),), min_tokens=6, logprobs=3,
    )  # fmt: skip
    return dataclasses.replace(base, **kw)


@pytest.fixture(scope="module")
def local(smollm2_weights: Any, smollm2_tokenizer: Any) -> LLMEngine:
    return LLMEngine(smollm2_weights, smollm2_tokenizer, EngineConfig(block_size=16, num_kv_blocks=64))


def post(url: str, path: str, body: dict) -> dict:
    r = httpx.post(f"{url}{path}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_penalized_seeded_logprobs_through_pd_equal_one_engine(pd_url: str, local: LLMEngine) -> None:
    outs = list(local.stream(local.tokenizer.encode(PROMPT), local_params()))
    want_text, want_ids = outs[-1].text, outs[-1].token_ids
    want_lps = [x for o in outs for x in o.logprobs]
    got = post(pd_url, "/v1/completions", BODY)["choices"][0]
    assert got["text"] == want_text
    lp = got["logprobs"]
    assert lp["tokens"] == [local.tokenizer.decode([i]) for i in want_ids]  # the prefill side's too
    assert lp["token_logprobs"] == pytest.approx([x.logprob for x in want_lps], abs=1e-4)
    tops = [{local.tokenizer.decode([i]): v for i, v in x.top} for x in want_lps]
    assert [set(t) for t in lp["top_logprobs"]] == [set(t) for t in tops]


def test_n_choices_with_a_seed_are_reproducible_through_pd(pd_url: str, local: LLMEngine) -> None:
    body = {**BODY, "n": 2, "max_tokens": 10, "min_tokens": 0, "logprobs": None}
    first = [c["text"] for c in post(pd_url, "/v1/completions", body)["choices"]]
    again = [c["text"] for c in post(pd_url, "/v1/completions", body)["choices"]]
    assert first == again
    assert first[0] != first[1], "two seeds gave the same text"
    prompt = local.tokenizer.encode(PROMPT)
    for i, text in enumerate(first):
        (want,) = local.generate(
            [prompt], local_params(max_tokens=10, min_tokens=0, logprobs=None, seed=5 + i)
        )
        assert text == want.text, f"choice {i} is not seed {5 + i}'s"


def test_chat_stream_logprobs_through_pd(pd_url: str, local: LLMEngine) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    body |= {"stream": True, "presence_penalty": 1.0}
    with httpx.stream("POST", f"{pd_url}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    content = [t for e in events for c in e["choices"] for t in (c.get("logprobs") or {}).get("content", [])]
    text = "".join(c["delta"].get("content", "") for e in events for c in e["choices"])
    prompt = local.tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    params = SamplingParams(max_tokens=8, temperature=0, logprobs=2, presence_penalty=1.0)
    (want,) = local.generate([list(prompt)], params)
    assert text == want.text
    assert [t["token"] for t in content] == [local.tokenizer.decode([i]) for i in want.token_ids]
    assert all(len(t["top_logprobs"]) == 2 for t in content)


def test_echo_with_prompt_logprobs_through_pd_equals_one_engine(pd_url: str, local: LLMEngine) -> None:
    """`echo` with `logprobs` in pd mode: the prefill instance computes the prompt's
    logprobs and sends them with the first token; the decode instance, which imports the
    KV, adds none. The answer equals one local engine's, prompt entries included."""
    prompt = local.tokenizer.encode(PROMPT)
    params = SamplingParams(max_tokens=5, temperature=0, logprobs=2, prompt_logprobs=2)
    outs = list(local.stream(prompt, params))
    want_prompt = outs[0].prompt_logprobs
    want_lps = [x for o in outs for x in o.logprobs]
    assert len(want_prompt) == len(prompt) - 1
    body = {"prompt": PROMPT, "echo": True, "max_tokens": 5, "temperature": 0, "logprobs": 2}
    got = post(pd_url, "/v1/completions", body)["choices"][0]
    assert got["text"] == PROMPT + outs[-1].text
    lp = got["logprobs"]
    assert lp["tokens"] == [local.tokenizer.decode([i]) for i in prompt + outs[-1].token_ids]
    want = [None, *(x.logprob for x in want_prompt), *(x.logprob for x in want_lps)]
    assert lp["token_logprobs"][0] is None
    assert lp["token_logprobs"][1:] == pytest.approx(want[1:], abs=1e-4)
    tops = [{local.tokenizer.decode([i]) for i, _ in x.top} for x in (*want_prompt, *want_lps)]
    assert [set(t) for t in lp["top_logprobs"][1:]] == tops
