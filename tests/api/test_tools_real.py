"""Tool calling over the real SmolLM2-135M engine: the prompt is transformers' own rendering
(for a chat template with tools, the template's; for SmolLM2's, which has none, the
messages this server writes), and greedy calls over HTTP are what the engine gives that
prompt and grammar."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import httpx
import pytest

from blitzscale.api.app import create_app
from blitzscale.api.chat_prompt import encode_chat, tool_prompt
from blitzscale.api.protocol import ChatCompletionRequest
from blitzscale.api.tools import call_format, plain_messages, renders_tools
from blitzscale.core.config import EngineConfig
from blitzscale.core.sampling import SamplingParams
from blitzscale.engine.engine import LLMEngine

from .conftest import BASE_URL
from .engine_backend import EngineBackend
from .test_tools import WEATHER

pytestmark = [pytest.mark.real_model, pytest.mark.anyio]

USER = {"role": "user", "content": "What is the weather in Paris?"}
CALL = {
    "id": "call_7",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
TURNS = [
    USER,
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_7", "content": "sunny, 21 C"},
]
# A chat template that renders tools, calls and results (ChatML with <tool_call> blocks)
WITH_TOOLS = """{%- if tools -%}
<|im_start|>system
You may call these functions:{% for t in tools %}
{{ t | tojson }}{% endfor %}
Call one as <tool_call>{"name": ..., "arguments": ...}</tool_call>.<|im_end|>
{% endif -%}
{%- for m in messages -%}
<|im_start|>{{ m.role }}
{% if m.content %}{{ m.content }}{% endif %}{% for c in m.tool_calls or [] -%}
<tool_call>{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}</tool_call>
{%- endfor %}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}"""


def engine_of(weights: Any, tokenizer: Any) -> LLMEngine:
    return LLMEngine(weights, tokenizer, EngineConfig(num_kv_blocks=24, max_model_len=768))


def prompt_of(backend: EngineBackend, body: dict[str, Any]) -> list[int]:
    request = ChatCompletionRequest.model_validate(body)
    messages = [{k: v for k, v in m.items() if v is not None} for m in body["messages"]]
    for m in messages:  # (the route's own conversion, as chat_message makes it)
        for c in m.get("tool_calls", ()):
            c["function"] = {**c["function"], "arguments": json.loads(c["function"]["arguments"])}
        m.setdefault("content", "")
    _, (shown, tools) = tool_prompt(backend, request, messages)
    return encode_chat(backend, shown, tools)


async def test_a_template_with_tools_renders_them_as_transformers_does(
    smollm2_weights: Any, smollm2_tokenizer: Any
) -> None:
    tok = copy.deepcopy(smollm2_tokenizer)  # (the session's tokenizer is shared: not changed)
    tok.chat_template = WITH_TOOLS
    backend = EngineBackend(engine_of(smollm2_weights, tok), "smollm2-135m")
    assert renders_tools(backend, backend.encode_chat) and call_format(WITH_TOOLS) == "hermes"
    hf_turns = copy.deepcopy(TURNS)
    hf_turns[1]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris"}  # transformers' form
    hf_turns[1]["content"] = ""
    expected = tok.apply_chat_template(hf_turns, tools=[WEATHER], add_generation_prompt=True, tokenize=True)
    expected = list(expected["input_ids"] if hasattr(expected, "keys") else expected)
    assert prompt_of(backend, {"messages": copy.deepcopy(TURNS), "tools": [WEATHER]}) == expected
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in tok.decode(expected)


async def test_forced_calls_over_http_are_the_engines_greedy_calls(
    smollm2_weights: Any, smollm2_tokenizer: Any
) -> None:
    engine = engine_of(smollm2_weights, smollm2_tokenizer)
    probe = EngineBackend(engine, "smollm2-135m")
    assert not renders_tools(probe, probe.encode_chat)  # SmolLM2's template has no tools
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in (named, "required"):
        body = {
            "messages": [USER],
            "tools": [WEATHER],
            "tool_choice": choice,
            "max_tokens": 40,
            "temperature": 0,
        }
        ids = prompt_of(probe, body)
        assert ids == probe.encode_chat(plain_messages([USER], [WEATHER]))
        async with (
            EngineBackend.running(engine, "smollm2-135m") as backend,
            httpx.AsyncClient(
                transport=httpx.ASGITransport(create_app(backend)), base_url=BASE_URL
            ) as client,
        ):
            r = await client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["usage"]["prompt_tokens"] == len(ids)
        (call,) = out["choices"][0]["message"]["tool_calls"]
        arguments = json.loads(call["function"]["arguments"])
        assert call["function"]["name"] == "get_weather" and isinstance(arguments["city"], str)
        # the engine, given the same prompt and the grammar the route built, says the same
        request = ChatCompletionRequest.model_validate(body)
        plan, _ = tool_prompt(probe, request, [USER])
        params = dataclasses.replace(SamplingParams(max_tokens=40, temperature=0), grammar=plan.grammar())
        [direct] = engine.generate([ids], params)
        said = json.loads(direct.text)
        if choice == "required":
            assert said == [{"name": "get_weather", "parameters": arguments}]
        else:
            assert said == arguments
    assert not engine.has_unfinished()


async def test_an_open_final_message_is_rendered_as_transformers_does(
    smollm2_weights: Any, smollm2_tokenizer: Any
) -> None:
    from blitzscale.api.chat_prompt import template_variables
    from blitzscale.core.chat import ChatOptions

    backend = EngineBackend(engine_of(smollm2_weights, smollm2_tokenizer), "smollm2-135m")
    turns = [USER, {"role": "assistant", "content": "It is"}]
    render = ChatOptions(add_generation_prompt=False, continue_final_message=True)
    want = smollm2_tokenizer.apply_chat_template(turns, continue_final_message=True, tokenize=True)
    want = list(want["input_ids"] if hasattr(want, "keys") else want)
    assert encode_chat(backend, turns, None, render) == want
    assert smollm2_tokenizer.decode(want).endswith("<|im_start|>assistant\nIt is")
    assert template_variables(backend.chat_template()) == {"messages", "add_generation_prompt"}
