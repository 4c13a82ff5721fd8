"""Tool calling on /v1/chat/completions over the fake backend: its chat template renders
no tools (`<role>content\\n`), so the server writes them into the messages; `reply` sets
what the model "says"."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from blitzscale.api.tools import TOOLS_INTRO

from .fake_backend import FakeBackend
from .helpers import assert_error, sse_json

pytestmark = pytest.mark.anyio

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
USER = [{"role": "user", "content": "Weather in Paris?"}]
CALL_TEXT = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture
def fake() -> FakeBackend:
    return FakeBackend(max_model_len=4096)  # (room for the tools' text)


def rendered(fake: FakeBackend) -> str:
    return fake.decode(fake.calls[-1].prompt_token_ids)


def tools_intro(*tools: dict[str, Any]) -> str:
    return TOOLS_INTRO.format(tools="\n".join(json.dumps(t) for t in tools))


async def chat(client: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 200, **body})


async def test_tools_are_written_into_a_template_that_has_none(
    client: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.reply = "ok"
    assert (await chat(client, tools=[WEATHER, ADD])).status_code == 200
    assert rendered(fake) == f"<system>{tools_intro(WEATHER, ADD)}\n<user>Weather in Paris?\n<assistant>"
    system = [{"role": "system", "content": "Be brief."}]
    assert (await chat(client, tools=[ADD], messages=system + USER)).status_code == 200
    assert rendered(fake).startswith(f"<system>Be brief.\n\n{tools_intro(ADD)}\n<user>")
    # "none": the model is not told of them (and nothing is read as a call)
    fake.reply = CALL_TEXT
    r = await chat(client, tools=[WEATHER], tool_choice="none")
    assert rendered(fake) == "<user>Weather in Paris?\n<assistant>"
    message = r.json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": CALL_TEXT}


async def test_auto_reads_the_calls_the_model_makes(client: httpx.AsyncClient, fake: FakeBackend) -> None:
    fake.reply = CALL_TEXT
    r = await chat(client, tools=[WEATHER, ADD])
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == "Let me check."
    (call,) = message["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert fake.calls[-1].params.grammar is None  # auto: the model chooses, unconstrained
    # a block that is no call of these tools stays text, and the reply ends as it did
    fake.reply = '<tool_call>{"name": "rm", "arguments": {}}</tool_call>'
    choice = (await chat(client, tools=[WEATHER])).json()["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": fake.reply}
    assert choice["finish_reason"] == "stop"


async def test_auto_streams_text_and_gives_each_call_whole(
    client: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.reply = CALL_TEXT + " Done."
    r = await chat(client, tools=[WEATHER], stream=True, n=2)
    assert r.status_code == 200
    chunks = sse_json(r.text)
    for index in (0, 1):
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"][0]["index"] == index]
        content = "".join(d.get("content", "") for d in deltas)
        assert content == "Let me check. Done."
        assert all("<" not in d.get("content", "") for d in deltas)  # no piece of a block leaks
        calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
        assert len(calls) == 1 and calls[0]["index"] == 0 and calls[0]["id"].startswith("call_")
        assert calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
        reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["index"] == index]
        assert reasons[-1] == "tool_calls" and not any(reasons[:-1])


async def test_required_constrains_to_an_array_of_calls(client: httpx.AsyncClient, fake: FakeBackend) -> None:
    fake.reply = (
        '[{"name": "add", "parameters": {"a": 1}}, {"name": "get_weather", "parameters": {"city": "Oslo"}}]'
    )
    r = await chat(client, tools=[WEATHER, ADD], tool_choice="required")
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert [c["function"] for c in choice["message"]["tool_calls"]] == [
        {"name": "add", "arguments": '{"a": 1}'},
        {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    ]
    grammar = fake.calls[-1].params.grammar
    assert grammar is not None and grammar.kind == "json_schema"
    schema = json.loads(grammar.schema)
    assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
    names = [item["properties"]["name"]["enum"] for item in schema["items"]["anyOf"]]
    assert names == [["get_weather"], ["add"]]
    assert schema["items"]["anyOf"][0]["properties"]["parameters"] == WEATHER["function"]["parameters"]
    assert schema["items"]["anyOf"][1]["properties"]["parameters"] == {"type": "object"}
    await chat(client, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    assert json.loads(fake.calls[-1].params.grammar.schema)["maxItems"] == 1


async def test_named_function_constrains_to_its_arguments(
    client: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.reply = '{"city": "Lima"}'
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = await chat(client, tools=[ADD, WEATHER], tool_choice=named)
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"  # as OpenAI's: a forced call ends with "stop"
    assert choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Lima"}'}
    grammar = fake.calls[-1].params.grammar
    assert json.loads(grammar.schema) == WEATHER["function"]["parameters"]
    # streamed: the first delta opens the call (id, name), the rest add to its arguments
    r = await chat(client, tools=[ADD, WEATHER], tool_choice=named, stream=True)
    deltas = [tc for c in sse_json(r.text) for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert deltas[0]["function"]["name"] == "get_weather" and deltas[0]["id"].startswith("call_")
    assert all(set(d) == {"index", "function"} and d["index"] == 0 for d in deltas[1:])
    assert "".join(d["function"]["arguments"] for d in deltas) == '{"city": "Lima"}'


async def test_earlier_calls_and_results_are_written_out(
    client: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.reply = "It is sunny."
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    messages = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "warm"},
    ]
    for tools in ([WEATHER], None):  # (the tools need not be sent again)
        r = await chat(client, messages=messages, tools=tools)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"] == {"role": "assistant", "content": "It is sunny."}
        turns = (
            "<user>Weather in Paris?\n"
            '<assistant><tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            "<user><tool_response>\nsunny\n</tool_response>\n<tool_response>\nwarm\n</tool_response>\n<assistant>"
        )
        head = f"<system>{tools_intro(WEATHER)}\n" if tools else ""
        assert rendered(fake) == head + turns
    r = await client.post("/tokenize", json={"messages": messages})
    assert r.json()["tokens"] == fake.encode(turns)
    r = await client.post("/tokenize", json={"messages": messages, "tools": [WEATHER]})  # (as the chat's)
    assert r.json()["tokens"] == fake.encode(f"<system>{tools_intro(WEATHER)}\n" + turns)
    r = await client.post("/tokenize", json={"prompt": "x", "tools": [WEATHER]})
    assert_error(r, 400, param="tools", says="only with messages")
    named = [*messages[:3], {**messages[3], "name": "get_weather"}]
    await chat(client, messages=named)
    assert '<tool_response name="get_weather">\nwarm\n' in rendered(fake)


async def test_required_keeps_each_tools_definitions_at_the_root(
    client: httpx.AsyncClient, fake: FakeBackend
) -> None:
    point = {"type": "object", "properties": {"x": {"type": "number"}}}
    tool = {"$defs": {"Point": point}, "type": "object", "properties": {"at": {"$ref": "#/$defs/Point"}}}
    move = {"type": "function", "function": {"name": "move", "parameters": tool}}
    fake.reply = '[{"name": "move", "parameters": {"at": {"x": 1}}}]'
    r = await chat(client, tools=[move, WEATHER], tool_choice="required")
    assert r.status_code == 200, r.text
    schema = json.loads(fake.calls[-1].params.grammar.schema)
    assert schema["$defs"] == {"Point": point}
    assert "$defs" not in schema["items"]["anyOf"][0]["properties"]["parameters"]
    other = {
        "type": "function",
        "function": {"name": "jump", "parameters": {"$defs": {"Point": {"type": "string"}}}},
    }
    r = await chat(client, tools=[move, other], tool_choice="required")
    assert_error(r, 400, param="tools[1].function.parameters.$defs.Point", says="differs")


BAD_CALL = {"id": "c", "type": "function", "function": {"name": "add", "arguments": "[1]"}}


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "add"}}},
            "tool_choice",
            "'add'",
        ),
        ({"tools": [ADD, ADD]}, "tools", "twice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, None, "tools"),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, None, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "x", "extra": 1}}]}, None, "extra"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, None, "tool_choice"),
        ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format", "tools"),
        (
            {"messages": [*USER, {"role": "assistant", "tool_calls": [BAD_CALL]}]},
            "messages[1].tool_calls[0].function.arguments",
            "JSON object",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id", "required"),
        (
            {"messages": [{"role": "user", "content": "x", "tool_calls": [BAD_CALL]}]},
            "messages[0].tool_calls",
            "assistant",
        ),
        (
            {"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]},
            "messages[0].tool_call_id",
            "tool",
        ),
    ],
)
async def test_bad_tool_requests_are_refused_by_name(
    client: httpx.AsyncClient, fake: FakeBackend, body: dict[str, Any], param: str | None, says: str
) -> None:
    r = await chat(client, **body)
    assert_error(r, 400, param=param, says=says)
    assert fake.calls == []
