"""Structured output end to end: the official openai client against the serving cluster in
pd mode (CPU workers, the real SmolLM2), so every request is prefilled on one instance (its
first token sampled under the grammar there) and decoded on another, which rebuilds the
grammar's state from the tokens that came with the KV. Twenty held-out schemas
(structured_schemas.py), sent together, each answer validated by `jsonschema`; streamed and
not, chat and completions; greedy answers equal one local engine's; a schema the library
cannot compile is a 400 naming the problem, and the cluster serves on."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import openai
import pytest

from blitzscale.core.sampling import Grammar
from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from tests.serve.structured_schemas import MAX_TOKENS, SCHEMAS

MODEL = "smollm2-135m"


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)


def _messages(ask: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{ask} Answer in JSON."}]


def _format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def test_twenty_held_out_schemas_through_the_openai_client(pd_url: str) -> None:
    client = _client(pd_url)

    def ask(case: tuple[str, str, dict[str, Any]]) -> Any:
        name, ask, schema = case
        return client.chat.completions.create(
            model=MODEL,
            messages=_messages(ask),  # type: ignore[arg-type]
            max_tokens=MAX_TOKENS,
            temperature=0,
            response_format=_format(name, schema),  # type: ignore[arg-type]
        )

    with ThreadPoolExecutor(len(SCHEMAS)) as pool:
        answers = list(pool.map(ask, SCHEMAS))
    for (name, _, schema), answer in zip(SCHEMAS, answers, strict=True):
        choice = answer.choices[0]
        assert choice.finish_reason == "stop", (name, choice.message.content)
        jsonschema.validate(json.loads(choice.message.content), schema)


@pytest.fixture(scope="module")
def local(smollm2_weights: Any, smollm2_tokenizer: Any) -> LLMEngine:
    return LLMEngine(smollm2_weights, smollm2_tokenizer, EngineConfig(block_size=16, num_kv_blocks=64))


def test_streamed_chat_and_completions_equal_one_engine(pd_url: str, local: LLMEngine) -> None:
    """Greedy answers through pd (the decode instance continues the grammar the prefill
    instance began) are one engine's, token for token; streamed chunks join into them."""
    name, ask, schema = SCHEMAS[5]  # a nested object
    grammar = Grammar("json_schema", json.dumps(schema))
    prompt = local.tokenizer.apply_chat_template(_messages(ask), add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    [want] = local.generate([prompt], SamplingParams(max_tokens=MAX_TOKENS, temperature=0, grammar=grammar))
    client = _client(pd_url)
    chunks = client.chat.completions.create(
        model=MODEL,
        messages=_messages(ask),  # type: ignore[arg-type]
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        response_format=_format(name, schema),  # type: ignore[arg-type]
    )
    parts = [(c.choices[0].delta.content or "", c.choices[0].finish_reason) for c in chunks if c.choices]
    assert "".join(p for p, _ in parts) == want.text and parts[-1][1] == "stop"
    jsonschema.validate(json.loads(want.text), schema)

    text = "A JSON object describing a cat: "
    ids = local.tokenizer(text).input_ids
    obj = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, grammar=Grammar("json_object"))
    [want] = local.generate([ids], obj)
    done = client.completions.create(
        model=MODEL,
        prompt=text,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"response_format": {"type": "json_object"}},
    )
    assert done.choices[0].text == want.text and done.choices[0].finish_reason == want.finish_reason
    if want.finish_reason == "stop":
        assert isinstance(json.loads(want.text), dict)


def test_a_schema_the_library_cannot_compile_is_a_400_and_the_cluster_serves_on(pd_url: str) -> None:
    client = _client(pd_url)
    bad = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(unclosed"}}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL,
            messages=_messages("Hi."),  # type: ignore[arg-type]
            max_tokens=8,
            response_format=_format("bad", bad),  # type: ignore[arg-type]
        )
    body = err.value.body
    assert isinstance(body, dict) and body["param"] == "response_format"
    assert "cannot be compiled" in body["message"] and "parenthesis is not closed" in body["message"]
    unique = {"type": "array", "items": {"enum": [1, 2]}, "uniqueItems": True, "minItems": 2, "maxItems": 3}
    with pytest.raises(openai.BadRequestError, match=r"uniqueItems \(at #\) is not enforced"):
        client.chat.completions.create(
            model=MODEL,
            messages=_messages("Hi."),  # type: ignore[arg-type]
            max_tokens=8,
            response_format=_format("unique", unique),  # type: ignore[arg-type]
        )
    with pytest.raises(openai.BadRequestError, match="'grammar' is not supported"):
        client.chat.completions.create(
            model=MODEL,
            messages=_messages("Hi."),  # type: ignore[arg-type]
            max_tokens=8,
            response_format={"type": "grammar"},  # type: ignore[arg-type,typeddict-item]
        )
    name, ask, schema = SCHEMAS[3]
    ok = client.chat.completions.create(
        model=MODEL,
        messages=_messages(ask),  # type: ignore[arg-type]
        max_tokens=MAX_TOKENS,
        temperature=0,
        response_format=_format(name, schema),  # type: ignore[arg-type]
    )
    jsonschema.validate(json.loads(ok.choices[0].message.content or ""), schema)


def test_a_forced_tool_call_through_pd_is_one_engines(pd_url: str, local: LLMEngine) -> None:
    """Tools through the serving cluster: SmolLM2's template has none, so the server writes
    them into the prompt; the named function's arguments, held to its schema across the
    prefill and decode instances, are one engine's greedy answer to that prompt; a schema
    that cannot be compiled is a 400 naming its tool."""
    from blitzscale.api.tools import plain_messages

    schema = SCHEMAS[5][2]
    tool = {"type": "function", "function": {"name": "describe", "parameters": schema}}
    messages = _messages(SCHEMAS[5][1])
    prompt = local.tokenizer.apply_chat_template(
        plain_messages(messages, [tool]), add_generation_prompt=True, tokenize=True
    )
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    grammar = Grammar("json_schema", json.dumps(schema))
    [want] = local.generate([prompt], SamplingParams(max_tokens=MAX_TOKENS, temperature=0, grammar=grammar))
    client = _client(pd_url)
    answer = client.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=MAX_TOKENS,
        temperature=0,
        tools=[tool],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "describe"}},
    )
    (call,) = answer.choices[0].message.tool_calls or []
    assert call.function.name == "describe" and call.function.arguments == want.text
    assert answer.usage is not None and answer.usage.prompt_tokens == len(prompt)
    jsonschema.validate(json.loads(call.function.arguments), schema)
    bad = {"type": "function", "function": {"name": "bad", "parameters": {"type": "string", "pattern": "("}}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=8,
            tools=[tool, bad],  # type: ignore[list-item]
            tool_choice="required",
        )
    body = err.value.body
    assert isinstance(body, dict) and body["param"] == "tools[1].function.parameters"
