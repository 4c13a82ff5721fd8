"""/v1/chat/completions over the fake backend (its chat template is `<role>content\\n`)."""

from __future__ import annotations

import httpx
import pytest

from blitzscale.api.openai_routes import CHAT_DEFAULT_MAX_TOKENS_CAP

from .fake_backend import FakeBackend
from .helpers import assert_error, sse_json

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
RENDERED = "<system>be brief\n<user>hi\n<assistant>"


async def test_chat_body_and_usage(client: httpx.AsyncClient, fake: FakeBackend) -> None:
    r = await client.post(
        "/v1/chat/completions", json={"model": "fake-model", "messages": MESSAGES, "max_tokens": 8}
    )
    assert r.status_code == 200
    body = r.json()
    assert body["id"].startswith("chatcmpl-") and body["id"] == r.headers["x-request-id"]
    assert body["object"] == "chat.completion"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": RENDERED[:8]},
            "logprobs": None,
            "finish_reason": "length",
        }
    ]
    assert body["usage"] == {
        "prompt_tokens": len(RENDERED),
        "completion_tokens": 8,
        "total_tokens": len(RENDERED) + 8,
    }
    assert fake.calls[0].prompt_token_ids == [ord(c) for c in RENDERED]


async def test_text_content_parts_are_joined(client: httpx.AsyncClient, fake: FakeBackend) -> None:
    parts = [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]
    body = {"messages": [{"role": "user", "content": parts}], "max_tokens": 2}
    assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    assert fake.calls[0].prompt_token_ids == [ord(c) for c in "<user>hi\n<assistant>"]


async def test_non_text_content_is_refused(client: httpx.AsyncClient) -> None:
    parts = [{"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}}]
    r = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": parts}]})
    assert_error(r, 400, param="messages[0].content", says="text")


async def test_default_max_tokens_is_the_rest_of_the_context(
    client: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.max_model_len = 100
    r = await client.post("/v1/chat/completions", json={"messages": MESSAGES})
    assert fake.calls[0].params.max_tokens == 100 - len(RENDERED)
    assert r.json()["choices"][0]["finish_reason"] == "length"


async def test_default_max_tokens_is_capped(client: httpx.AsyncClient, fake: FakeBackend) -> None:
    fake.max_model_len = 100_000
    r = await client.post("/v1/chat/completions", json={"messages": MESSAGES})
    assert fake.calls[0].params.max_tokens == CHAT_DEFAULT_MAX_TOKENS_CAP
    assert r.json()["usage"]["completion_tokens"] == CHAT_DEFAULT_MAX_TOKENS_CAP


async def test_max_completion_tokens_wins(client: httpx.AsyncClient, fake: FakeBackend) -> None:
    body = {"messages": MESSAGES, "max_tokens": 9, "max_completion_tokens": 3}
    r = await client.post("/v1/chat/completions", json=body)
    assert r.json()["usage"]["completion_tokens"] == 3


async def test_over_long_chat_names_the_prompt(client: httpx.AsyncClient, fake: FakeBackend) -> None:
    fake.max_model_len = 10
    r = await client.post("/v1/chat/completions", json={"messages": MESSAGES})
    assert_error(r, 400, says="prompt has")


async def test_chat_stream_chunks(client: httpx.AsyncClient) -> None:
    body = {"messages": MESSAGES, "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    r = await client.post("/v1/chat/completions", json=body)
    chunks = sse_json(r.text)
    first, *content, last_text, usage = chunks
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"] for c in content] == [{"content": "<"}, {"content": "s"}]
    assert last_text["choices"][0] == {
        "index": 0,
        "delta": {"content": "y"},
        "logprobs": None,
        "finish_reason": "length",
    }
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3
    for c in chunks:
        assert c["object"] == "chat.completion.chunk" and c["id"] == r.headers["x-request-id"]


async def test_chat_stream_ends_with_empty_delta_when_last_output_has_no_text(
    client: httpx.AsyncClient,
) -> None:
    """EOS produces no text: the finishing chunk has an empty delta and the finish reason."""
    body = {"messages": [{"role": "user", "content": "#"}], "max_tokens": 30, "stream": True}
    chunks = sse_json((await client.post("/v1/chat/completions", json=body)).text)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == "<user>"  # the echo of the rendered prompt up to the EOS "#"
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}


async def test_a_message_name_the_chat_template_drops_is_refused(
    client: httpx.AsyncClient, fake: FakeBackend
) -> None:
    """A template that renders names takes them; one that drops them (SmolLM2's) would
    answer as if none was sent: a 400 naming the message instead."""
    named = {"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "x", "name": "bob"}]}
    assert (await client.post("/v1/chat/completions", json=named | {"max_tokens": 1})).status_code == 200

    def ignores_names(messages: list[dict], tools: object = None, options: object = None) -> list[int]:
        return fake.encode("".join(m["content"] for m in messages))

    fake.encode_chat = ignores_names  # type: ignore[method-assign]
    for path in ("/v1/chat/completions", "/tokenize"):
        r = await client.post(path, json=named)
        assert_error(r, 400, param="messages[1].name", says="chat template does not use it")
    plain = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    assert (await client.post("/v1/chat/completions", json=plain)).status_code == 200
