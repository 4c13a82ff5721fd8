"""/v1/completions over the fake backend: bodies, parameter mapping, stop handling, streams."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from blitzscale.api.app import create_app
from blitzscale.core.outputs import RequestOutput
from blitzscale.core.sampling import SamplingParams
from blitzscale.errors import OverloadedError

from .conftest import BASE_URL
from .fake_backend import FakeBackend
from .helpers import assert_error, sse_json

pytestmark = pytest.mark.anyio


async def test_completion_body_and_usage(client: httpx.AsyncClient, fake: FakeBackend) -> None:
    r = await client.post(
        "/v1/completions", json={"model": "fake-model", "prompt": "hello world", "max_tokens": 5}
    )
    assert r.status_code == 200
    body = r.json()
    assert body["id"].startswith("cmpl-") and len(body["id"]) == len("cmpl-") + 32
    assert r.headers["x-request-id"] == body["id"] == fake.calls[0].request_id
    assert body["object"] == "text_completion"
    assert body["model"] == "fake-model"
    assert abs(body["created"] - time.time()) < 60
    assert body["choices"] == [{"index": 0, "text": "hello", "logprobs": None, "finish_reason": "length"}]
    assert body["usage"] == {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}
    assert fake.aborted == []  # a request that finished is not aborted


async def test_defaults_map_to_sampling_params(client: httpx.AsyncClient, fake: FakeBackend) -> None:
    r = await client.post("/v1/completions", json={"prompt": "abc"})  # no model: accepted
    assert r.status_code == 200
    assert fake.calls[0].params == SamplingParams(max_tokens=16, temperature=1.0, top_p=1.0, top_k=0)
    assert r.json()["usage"]["completion_tokens"] == 16


async def test_all_parameters_map_to_sampling_params(client: httpx.AsyncClient, fake: FakeBackend) -> None:
    body = {
        "prompt": "abc",
        "max_tokens": 7,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "seed": 123,
        "stop": ["zz", "yy"],
        "stop_token_ids": [5],
        "ignore_eos": True,
        "n": 1,
        "user": "ignored",
        "presence_penalty": 0,
    }
    assert (await client.post("/v1/completions", json=body)).status_code == 200
    assert fake.calls[0].params == SamplingParams(
        max_tokens=7, temperature=0.5, top_p=0.9, top_k=40, seed=123, stop=("zz", "yy"),
        stop_token_ids=(5,), ignore_eos=True,
    )  # fmt: skip


async def test_null_means_default(client: httpx.AsyncClient, fake: FakeBackend) -> None:
    body = {"prompt": "abc", "max_tokens": None, "temperature": None, "top_p": None, "stop": None, "n": None}
    assert (await client.post("/v1/completions", json=body)).status_code == 200
    assert fake.calls[0].params == SamplingParams(max_tokens=16)


@pytest.mark.parametrize(
    "prompt",
    [
        "hi there",
        [104, 105, 32, 116, 104, 101, 114, 101],
        ["hi there"],
        [[104, 105, 32, 116, 104, 101, 114, 101]],
    ],
)
async def test_prompt_forms(client: httpx.AsyncClient, fake: FakeBackend, prompt: object) -> None:
    r = await client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 8})
    assert r.status_code == 200
    assert fake.calls[0].prompt_token_ids == [ord(c) for c in "hi there"]
    assert r.json()["choices"][0]["text"] == "hi there"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_batch_of_prompts_gives_n_choices_each_in_order(
    client: httpx.AsyncClient, fake: FakeBackend, stream: bool
) -> None:
    """As OpenAI's and vLLM's: choice i answers prompt i // n; the usage counts each prompt
    once. (The fake backend answers each prompt by repeating its text.)"""
    body = {"prompt": ["ab", "cde"], "max_tokens": 4, "n": 2, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    if stream:
        chunks = sse_json(r.text)
        texts = [
            "".join(c["choices"][0]["text"] for c in chunks if c["choices"] and c["choices"][0]["index"] == i)
            for i in range(4)
        ]
        usage = chunks[-1]["usage"]
    else:
        texts = [c["text"] for c in sorted(r.json()["choices"], key=lambda c: c["index"])]
        usage = r.json()["usage"]
    assert texts == ["abab", "abab", "cdec", "cdec"]
    assert sorted(c.prompt_token_ids for c in fake.calls) == [
        [97, 98],
        [97, 98],
        [99, 100, 101],
        [99, 100, 101],
    ]
    assert usage == {"prompt_tokens": 5, "completion_tokens": 16, "total_tokens": 21}


async def test_a_batch_names_its_bad_prompt_and_is_capped(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/completions", json={"prompt": ["a", ""]})
    assert_error(r, 400, param="prompt[1]", says="prompt[1] is empty")
    r = await client.post("/v1/completions", json={"prompt": ["a"] * 1025, "n": 2})
    assert_error(r, 400, param="prompt", says="1025 prompts x n=2 is 2050 choices: at most 2048")


async def test_stop_string_cuts_and_finishes(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/completions", json={"prompt": "hello world", "max_tokens": 20, "stop": "wor"})
    choice = r.json()["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == ("hello ", "stop")
    assert r.json()["usage"]["completion_tokens"] == 9  # the tokens of "wor" were generated


async def test_first_of_several_stop_strings(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/completions", json={"prompt": "abcdefgh", "max_tokens": 20, "stop": ["fg", "cd"]}
    )
    assert r.json()["choices"][0]["text"] == "ab"


async def test_eos_finishes_unless_ignored(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/completions", json={"prompt": "ab#", "max_tokens": 10})
    assert r.json()["choices"][0] == {"index": 0, "text": "ab", "logprobs": None, "finish_reason": "stop"}
    assert r.json()["usage"]["completion_tokens"] == 3
    r = await client.post("/v1/completions", json={"prompt": "ab#", "max_tokens": 5, "ignore_eos": True})
    assert r.json()["choices"][0]["text"] == "ab#ab"


async def test_stream_chunks(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 4, "stream": True})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    chunks = sse_json(r.text)
    assert [c["choices"][0]["text"] for c in chunks] == ["h", "e", "l", "l"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "length"]
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and ids.pop() == r.headers["x-request-id"]
    for c in chunks:
        assert c["object"] == "text_completion" and c["model"] == "fake-model"
        assert c["usage"] is None  # no usage chunk unless asked


async def test_stream_usage_chunk(client: httpx.AsyncClient) -> None:
    body = {"prompt": "hello", "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    chunks = sse_json((await client.post("/v1/completions", json=body)).text)
    *text_chunks, last = chunks
    assert last["choices"] == []
    assert last["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    assert all(c["usage"] is None for c in text_chunks)


async def test_stream_text_equals_non_stream_text_with_stop(
    client: httpx.AsyncClient, fake: FakeBackend
) -> None:
    """Deltas never show a stop string that is still forming (the backend holds it back)."""
    body = {"prompt": "one two three", "max_tokens": 30, "stop": ["thr", "xyz"]}
    whole = (await client.post("/v1/completions", json=body)).json()["choices"][0]
    chunks = sse_json((await client.post("/v1/completions", json=body | {"stream": True})).text)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["text"] == "one two "
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["finish_reason"] == "stop"


async def test_streamed_text_offsets_are_the_whole_responses_behind_a_stop_string(
    client: httpx.AsyncClient,
) -> None:
    """A stop string that may be forming holds a chunk's text back, not its tokens: the
    tokens' `text_offset`s still count every token before them, as a whole response's do."""
    body = {"prompt": "one two three", "max_tokens": 30, "stop": ["thr", "xyz"], "logprobs": 0}
    whole = (await client.post("/v1/completions", json=body)).json()["choices"][0]["logprobs"]
    chunks = sse_json((await client.post("/v1/completions", json=body | {"stream": True})).text)
    streamed = [c["choices"][0]["logprobs"] for c in chunks]
    assert [t for lp in streamed for t in lp["tokens"]] == whole["tokens"]
    assert [o for lp in streamed for o in lp["text_offset"]] == whole["text_offset"]
    assert whole["text_offset"] == sorted(set(whole["text_offset"]))  # (one per token, rising)


async def test_outputs_of_several_tokens(client: httpx.AsyncClient, fake: FakeBackend) -> None:
    fake.tokens_per_output = 3
    body = {"prompt": "abcdefg", "max_tokens": 7, "stream": True, "stream_options": {"include_usage": True}}
    chunks = sse_json((await client.post("/v1/completions", json=body)).text)
    assert [c["choices"][0]["text"] for c in chunks[:-1]] == ["abc", "def", "g"]
    assert chunks[-1]["usage"]["completion_tokens"] == 7


async def test_a_request_run_again_answers_with_its_last_run_only(
    client: httpx.AsyncClient, fake: FakeBackend
) -> None:
    """A request whose client reads only the whole answer may run again after some output
    (its instance died): the answer, its usage and its logprobs are the last run's."""
    fake.restart_after = 3
    body = {"prompt": "hello world", "max_tokens": 5, "logprobs": 0}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200
    choice = r.json()["choices"][0]
    assert choice["text"] == "hello"
    assert choice["logprobs"]["token_logprobs"] == [-0.5] * 5  # none of the first run's -9.0
    assert r.json()["usage"]["completion_tokens"] == 5
    assert fake.calls[0].stream is False
    r = await client.post("/v1/completions", json={**body, "stream": True})  # a stream never runs again
    assert "X" not in "".join(c["choices"][0]["text"] for c in sse_json(r.text) if c["choices"])
    assert fake.calls[1].stream is True


class RefusesB(FakeBackend):
    """Holds every request (nothing is produced) but refuses the prompt "b" as overloaded,
    as the router refuses a prompt that could not start in time."""

    async def generate(  # type: ignore[override]
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, stream: bool = True
    ) -> AsyncIterator[RequestOutput]:
        if prompt_token_ids == [ord("b")]:
            raise OverloadedError("the server is overloaded: the request could start in about 9 s", 7.0)
        async for out in super().generate(request_id, prompt_token_ids, params, stream):
            yield out


async def test_a_refused_prompt_of_a_batch_stops_the_others_at_once() -> None:
    """Prompt 1 is refused while prompt 0 is still queued: the answer is the refusal (a
    429 naming the prompt and why retrying the same batch meets the same queue) at once,
    and prompt 0 is aborted rather than waited for."""
    fake = RefusesB(hold=True)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(create_app(fake)), base_url=BASE_URL) as c:
        r = await asyncio.wait_for(c.post("/v1/completions", json={"prompt": ["a", "b"]}), 60)
    assert_error(r, 429, says="prompt[1] of a batch of 2: the server is overloaded")
    assert "send fewer prompts a request" in r.json()["error"]["message"]
    assert r.headers["retry-after"] == "7"
    assert not fake.running and any(a.endswith("-0") for a in fake.aborted)  # the held one too
