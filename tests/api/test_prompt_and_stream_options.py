"""vLLM's `truncate_prompt_tokens` and `stream_options.continuous_usage_stats`, TGI's
`truncate` and `top_n_tokens`, over the fake backend (one character, one token)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from .fake_backend import FakeBackend
from .helpers import assert_error, assert_tgi_error, sse_data, sse_json

pytestmark = pytest.mark.anyio


async def test_truncate_prompt_tokens_keeps_the_last_tokens(
    client: httpx.AsyncClient, fake: FakeBackend
) -> None:
    body = {"prompt": "abcdefgh", "max_tokens": 2, "truncate_prompt_tokens": 3, "echo": True}
    r = await client.post("/v1/completions", json=body)
    assert fake.calls[-1].prompt_token_ids == fake.encode("fgh")
    assert r.json()["choices"][0]["text"] == "fghfg"  # (echo: the prompt that ran)
    assert r.json()["usage"]["prompt_tokens"] == 3
    await client.post("/v1/completions", json={**body, "prompt": "ab"})  # shorter: whole
    assert fake.calls[-1].prompt_token_ids == fake.encode("ab")
    await client.post(
        "/v1/completions", json={**body, "prompt": "x" * 200 + "yz", "truncate_prompt_tokens": 100}
    )
    assert fake.calls[-1].prompt_token_ids == fake.encode("x" * 98 + "yz")
    await client.post("/v1/completions", json={**body, "prompt": "abc", "truncate_prompt_tokens": -1})
    assert fake.calls[-1].prompt_token_ids == fake.encode("abc")  # -1: the context's worth
    chat = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 1, "truncate_prompt_tokens": 4}
    await client.post("/v1/chat/completions", json=chat)
    assert fake.calls[-1].prompt_token_ids == fake.encode("istant>"[-4:])


@pytest.mark.parametrize(("keep", "says"), [(0, "at least 1"), (-2, "at least 1"), (10**6, "more than")])
async def test_bad_truncate_prompt_tokens(client: httpx.AsyncClient, keep: int, says: str) -> None:
    body = {"prompt": "abc", "truncate_prompt_tokens": keep}
    assert_error(
        await client.post("/v1/completions", json=body), 400, param="truncate_prompt_tokens", says=says
    )


async def test_tgi_truncate_and_its_prefill(client: httpx.AsyncClient, fake: FakeBackend) -> None:
    params = {"max_new_tokens": 2, "truncate": 3, "decoder_input_details": True}
    r = await client.post("/generate", json={"inputs": "abcdefgh", "parameters": params})
    assert fake.calls[-1].prompt_token_ids == fake.encode("fgh")
    details = r.json()["details"]
    assert [t["text"] for t in details["prefill"]] == ["f", "g", "h"] and details["input_length"] == 3
    r = await client.post("/generate", json={"inputs": "abc", "parameters": {"truncate": -5}})
    assert_tgi_error(r, 422, param="parameters.truncate", says="at least 1")


async def test_tgi_top_n_tokens(client: httpx.AsyncClient, fake: FakeBackend) -> None:
    params: dict[str, Any] = {"max_new_tokens": 3, "details": True, "top_n_tokens": 2}
    details = (await client.post("/generate", json={"inputs": "abc", "parameters": params})).json()["details"]
    assert [[t["text"] for t in tops] for tops in details["top_tokens"]] == [
        ["a", "b"],
        ["b", "c"],
        ["c", "d"],
    ]
    assert details["top_tokens"][0][1] == {"id": ord("b"), "text": "b", "logprob": -1.5, "special": False}
    events = [
        json.loads(e)
        for e in sse_data(
            (await client.post("/generate_stream", json={"inputs": "abc", "parameters": params})).text
        )
    ]
    assert [[t["id"] for t in e["top_tokens"]] for e in events] == [[97, 98], [98, 99], [99, 100]]
    plain = (await client.post("/generate", json={"inputs": "abc", "parameters": {"details": True}})).json()
    assert "top_tokens" not in plain["details"]  # (as TGI: only when asked)
    r = await client.post("/generate", json={"inputs": "abc", "parameters": {"top_n_tokens": 21}})
    assert_tgi_error(r, 422, param="parameters.top_n_tokens")


async def test_continuous_usage_stats(client: httpx.AsyncClient) -> None:
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    chunks = sse_json((await client.post("/v1/chat/completions", json=body)).text)
    prompt = len("<user>hi\n<assistant>")
    for index in (0, 1):
        mine = [c for c in chunks if c["choices"] and c["choices"][0]["index"] == index]
        assert [c["usage"]["completion_tokens"] for c in mine] == [0, 1, 2, 3]
        assert all(c["usage"]["prompt_tokens"] == prompt for c in mine)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    done = sse_json(
        (await client.post("/v1/completions", json={**body, "prompt": "ab", "messages": None})).text
    )
    assert [c["usage"]["total_tokens"] for c in done if c["choices"] and c["choices"][0]["index"] == 0] == [
        3,
        4,
        5,
    ]
