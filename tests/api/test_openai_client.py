"""The official `openai` client against a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from blitzscale.api.app import create_app

from .fake_backend import FakeBackend
from .live_server import live_server

KEY = "sk-local-test"
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def fake() -> FakeBackend:
    return FakeBackend()


@pytest.fixture(scope="module")
def client(fake: FakeBackend) -> Iterator[openai.OpenAI]:
    with (
        live_server(create_app(fake, api_key=KEY)) as url,
        openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=10) as c,
    ):
        yield c


def test_completion(client: openai.OpenAI) -> None:
    c = client.completions.create(model="fake-model", prompt="hello world", max_tokens=5, temperature=0)
    assert c.id.startswith("cmpl-")
    assert c.choices[0].text == "hello" and c.choices[0].finish_reason == "length"
    assert (c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens) == (11, 5, 16)


def test_completion_stream(client: openai.OpenAI) -> None:
    stream = client.completions.create(
        model="fake-model", prompt="hello", max_tokens=4, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "hell"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


def test_chat(client: openai.OpenAI) -> None:
    c = client.chat.completions.create(
        model="fake-model", messages=MESSAGES, max_completion_tokens=6, stop=["r"]
    )
    assert c.id.startswith("chatcmpl-")
    assert c.choices[0].message.role == "assistant"
    assert c.choices[0].message.content == "<use"
    assert c.choices[0].finish_reason == "stop"
    assert c.usage.prompt_tokens == len("<user>hi\n<assistant>")


def test_chat_stream(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="fake-model",
        messages=MESSAGES,
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "<user"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == len("<user>hi\n<assistant>") + 5


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["fake-model"]
    assert client.models.retrieve("fake-model").id == "fake-model"
    with pytest.raises(openai.NotFoundError, match="gpt-4o"):
        client.models.retrieve("gpt-4o")


def test_n_choices_with_seeds(client: openai.OpenAI, fake: FakeBackend) -> None:
    """n=3 runs three backend requests, choice i seeded seed + i; streamed chunks name their
    choice; usage counts the prompt once."""
    r = client.completions.create(model="fake-model", prompt="abc", max_tokens=4, n=3, seed=7)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == ["abca"] * 3
    assert sorted(c.params.seed for c in fake.calls[-3:]) == [7, 8, 9]
    assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens) == (3, 12)
    stream = client.chat.completions.create(
        model="fake-model",
        messages=MESSAGES,
        max_tokens=3,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    choices = [c.choices[0] for c in chunks if c.choices]
    texts = {i: "".join(c.delta.content or "" for c in choices if c.index == i) for i in (0, 1)}
    assert texts == {0: "<us", 1: "<us"}
    finished = [c.index for c in choices if c.finish_reason]
    assert sorted(finished) == [0, 1]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6


def test_errors_then_good_requests(client: openai.OpenAI, fake: FakeBackend) -> None:
    with pytest.raises(openai.BadRequestError, match="max_tokens must be at least 1"):
        client.completions.create(model="fake-model", prompt="x", max_tokens=-1)
    with pytest.raises(openai.NotFoundError, match="gpt-4o"):
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        client.completions.create(model="fake-model", prompt="x", presence_penalty=5.0)
    with pytest.raises(openai.BadRequestError, match="prompt has"):
        client.completions.create(model="fake-model", prompt="x" * 500, stream=True)
    wrong = client.with_options(api_key="sk-wrong")
    with pytest.raises(openai.AuthenticationError):
        wrong.completions.create(model="fake-model", prompt="x")
    assert client.completions.create(model="fake-model", prompt="ok", max_tokens=2).choices[0].text == "ok"


def test_error_in_the_middle_of_a_stream_raises(client: openai.OpenAI, fake: FakeBackend) -> None:
    fake.fail_after = 1
    try:
        stream = client.completions.create(model="fake-model", prompt="hello", max_tokens=5, stream=True)
        with pytest.raises(openai.APIError):
            list(stream)
    finally:
        fake.fail_after = None


def test_tool_calls(client: openai.OpenAI, fake: FakeBackend) -> None:
    """The client's own types read a call, whole and streamed (deltas joined by index)."""
    tool = {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
        },
    }
    fake.reply, fake.max_model_len = (
        '<tool_call>{"name": "get_time", "arguments": {"tz": "UTC"}}</tool_call>',
        2048,
    )
    try:
        c = client.chat.completions.create(
            model="fake-model", messages=MESSAGES, tools=[tool], max_tokens=100
        )
        choice = c.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls or []
        assert (call.function.name, json.loads(call.function.arguments)) == ("get_time", {"tz": "UTC"})
        stream = client.chat.completions.create(
            model="fake-model", messages=MESSAGES, tools=[tool], max_tokens=100, stream=True
        )
        calls: dict[int, dict[str, str]] = {}
        for chunk in stream:
            for tc in chunk.choices[0].delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                entry["name"] += (tc.function and tc.function.name) or ""
                entry["arguments"] += (tc.function and tc.function.arguments) or ""
        assert calls == {0: {"name": "get_time", "arguments": '{"tz": "UTC"}'}}
    finally:
        fake.reply, fake.max_model_len = None, 128
