"""Every error answers with the right status and an OpenAI-style body, and the server goes on
serving: each case is followed by a good request on the same app."""

from __future__ import annotations

import json

import anyio
import httpx
import pytest

from blitzscale.api.app import create_app

from .conftest import BASE_URL
from .fake_backend import FakeBackend
from .helpers import assert_error, assert_tgi_error, sse_json

pytestmark = pytest.mark.anyio

GOOD = {"prompt": "hello", "max_tokens": 2}
CHAT = "/v1/chat/completions"

COMPLETION_CASES = [
    # (raw body, status, param, words the message must contain)
    ("{not json", 400, None, "malformed JSON"),
    ('{"prompt": 5}', 400, "prompt", "valid string"),
    ('{"max_tokens": 3}', 400, "prompt", "field required"),
    ('{"prompt": "x", "max_tokens": "many"}', 400, "max_tokens", "valid integer"),
    ('{"prompt": "x", "stop": [1]}', 400, "stop", "valid string"),
    ('{"prompt": "x", "max_tokens": -1}', 400, None, "max_tokens must be at least 1, got -1"),
    ('{"prompt": "x", "max_tokens": 0}', 400, None, "max_tokens must be at least 1, got 0"),
    ('{"prompt": "x", "temperature": -0.5}', 400, "temperature", "greater than or equal to 0"),
    ('{"prompt": "x", "temperature": 2.5}', 400, "temperature", "less than or equal to 2"),
    ('{"prompt": "x", "presence_penalty": 5.0}', 400, "presence_penalty", "less than or equal to 2"),
    ('{"prompt": "x", "frequency_penalty": -3}', 400, "frequency_penalty", "greater than or equal to -2"),
    ('{"prompt": "x", "repetition_penalty": 0}', 400, "repetition_penalty", "greater than 0"),
    ('{"prompt": "x", "logit_bias": {"5": 200}}', 400, "logit_bias", "[-100, 100]"),
    ('{"prompt": "x", "logit_bias": {"five": 1}}', 400, "logit_bias.five", "valid integer"),
    ('{"prompt": "x", "min_tokens": -1}', 400, "min_tokens", "greater than or equal to 0"),
    ('{"prompt": "x", "max_tokens": 2, "min_tokens": 3}', 400, "min_tokens", "must not exceed max_tokens"),
    ('{"prompt": "x", "max_tokens": 1000000}', 400, "max_tokens", "at most 127 tokens can be generated"),
    ('{"prompt": "x", "n": 0}', 400, "n", "greater than or equal to 1"),
    ('{"prompt": "x", "n": 129}', 400, "n", "less than or equal to 128"),
    ('{"prompt": "x", "logprobs": 21}', 400, "logprobs", "less than or equal to 20"),
    ('{"prompt": "x", "min_p": 1.5}', 400, "min_p", "min_p must be in [0, 1], got 1.5"),
    ('{"prompt": "x", "use_beam_search": true}', 400, "use_beam_search", "not supported"),
    ('{"prompt": "x", "top_p": 0}', 400, None, "top_p must be in (0, 1]"),
    ('{"prompt": "x", "stop": [""]}', 400, None, "stop strings must not be empty"),
    ('{"prompt": ""}', 400, "prompt", "prompt is empty"),
    ('{"prompt": []}', 400, None, "prompt is empty"),
    ('{"prompt": "' + "x" * 128 + '"}', 400, None, "prompt has 128 tokens but the context is 128"),
    ('{"prompt": "x", "model": "gpt-4"}', 404, "model", "gpt-4"),
    ("[1, 2]", 400, None, "valid dictionary"),
    ('{"prompt": "x", "suffix": "y"}', 400, "suffix", "not supported"),
    # text no UTF-8 can carry (a JSON escape of a lone surrogate), numbers with no stand-ins
    ('{"prompt": "x", "stop": ["ok", "\\ud800"]}', 400, "stop[1]", "not valid Unicode: it holds a lone"),
    ('{"prompt": "a\\udfffb"}', 400, "prompt", "lone surrogate (U+DFFF)"),
    ('{"prompt": "x", "logit_bias": {"\\ud800": 1}}', 400, "logit_bias.\\ud800", "not valid Unicode"),
    ('{"prompt": "x", "temperature": "0.5"}', 400, "temperature", "valid number"),
    ('{"prompt": "x", "user": 5}', 400, "user", "valid string"),
    ('{"prompt": "x", "store": "no"}', 400, "store", "valid boolean"),
    ('{"prompt": "x", "top_p": true}', 400, "top_p", "valid number"),
    ('{"prompt": "x", "temperature": NaN}', 400, "temperature", "finite number"),
    ('{"prompt": "x", "logit_bias": {"5": "1"}}', 400, "logit_bias.5", "valid number"),
    ('{"prompt": "x", "best_of": 3}', 400, "best_of", "not supported"),
]


@pytest.mark.parametrize(("raw", "status", "param", "says"), COMPLETION_CASES)
@pytest.mark.parametrize("stream", [False, True])
async def test_completion_errors(
    client: httpx.AsyncClient,
    fake: FakeBackend,
    raw: str,
    status: int,
    param: str | None,
    says: str,
    stream: bool,
) -> None:
    if stream and raw.startswith('{"'):
        raw = raw[:-1] + ', "stream": true}'
    r = await client.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    error = assert_error(r, status, param=param, says=says)
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    good = await client.post("/v1/completions", json=GOOD)
    assert good.status_code == 200 and good.json()["choices"][0]["text"] == "he"
    assert fake.aborted == []  # rejected before they ran: nothing to free


@pytest.mark.parametrize(
    ("body", "status", "param", "says"),
    [
        ({"messages": []}, 400, "messages", "at least 1"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role", "input should be"),
        ({"messages": [{"content": "x"}]}, 400, "messages[0].role", "field required"),
        ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -3}, 400, None, "got -3"),
        ({"messages": [{"role": "user", "content": "x"}], "model": "other"}, 404, "model", "other"),
        ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400, "top_logprobs",
         "logprobs"),
        ({"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 25}, 400,
         "top_logprobs", "less than or equal to 20"),
        ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 10**6}, 400,
         "max_completion_tokens", "at most"),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, 400, "tool_choice",
         "needs tools"),
        ({"messages": [{"role": "user", "content": "x"}], "guided_json": {}}, 400, "guided_json",
         "not supported"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, 400,
         "tools[0].function", "field required"),
        ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "regex"}}, 400,
         "response_format", "'regex' is not supported"),
        ({"messages": [{"role": "user", "content": "x"}],
          "response_format": {"type": "json_object", "json_schema": {"name": "a", "schema": {}}}}, 400,
         "response_format.json_schema", "read only with type json_schema (the type is 'json_object')"),
        ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}}, 400,
         "response_format.json_schema", "needs json_schema.schema"),
        ({"messages": [{"role": "user", "content": "x"}],
          "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": [1]}}}, 400,
         "response_format.json_schema.schema", "valid dictionary"),
        ({"messages": [{"role": "user", "content": "x"}],
          "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}, "x": 1}}},
         400, "response_format.json_schema.x", "Extra inputs"),
        # nothing a message carries is dropped unseen
        ({"messages": [{"role": "user", "content": "x", "foo": 1}]}, 400, "messages[0].foo", "not supported"),
        ({"messages": [{"role": "user"}]}, 400, "messages[0].content", "required"),
        ({"messages": [{"role": "user", "content": None}]}, 400, "messages[0].content", "required"),
        ({"messages": [{"role": "user", "content": "x"},
                       {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}]}, 400,
         "messages[1].tool_calls[0].function", "field required"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {}}]}]},
         400, "messages[0].content[0].cache_control", "not supported"),
        # stream_options only with a stream, and only what it knows
        ({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": True}}, 400,
         "stream_options", "only allowed when stream is true"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": True,
          "stream_options": {"include_usage": True, "continuous_usage": True}}, 400,
         "stream_options.continuous_usage", "Extra inputs"),
        # types as the API has them: no string for a number, no boolean for a count
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}, 400, "max_tokens", "integer"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": True}, 400, "max_tokens", "integer"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, 400, "stream", "boolean"),
        ({"messages": [{"role": "user", "content": "x"}], "presence_penalty": "1"}, 400, "presence_penalty",
         "valid number"),
        ({"messages": [{"role": "user", "content": "x"}],
          "response_format": {"type": "json_schema",
                              "json_schema": {"name": "a", "schema": {}, "strict": "yes"}}},
         400, "response_format.json_schema.strict", "valid boolean"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": True,
          "stream_options": {"include_obfuscation": True}}, 400, "stream_options.include_obfuscation",
         "not supported"),
    ],
)  # fmt: skip
async def test_chat_errors(
    client: httpx.AsyncClient, body: dict, status: int, param: str | None, says: str
) -> None:
    assert_error(await client.post("/v1/chat/completions", json=body), status, param=param, says=says)
    good = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    assert (await client.post("/v1/chat/completions", json=good)).status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CHAT, {"messages": [{"role": "user", "content": "hi \ud83d"}]}, "messages[0].content"),
        (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udc00"}]}]},
         "messages[0].content[0].text"),
        (CHAT, {"messages": [{"role": "user", "content": "x", "name": "\ud800"}]}, "messages[0].name"),
        ("/tokenize", {"prompt": "\ud800"}, "prompt"),
        ("/generate", {"inputs": "x", "parameters": {"stop": ["\ud800"]}}, "parameters.stop[0]"),
        ("/generate_stream", {"inputs": "\ud800"}, "inputs"),
    ],
)  # fmt: skip
async def test_text_that_is_not_unicode_is_refused_naming_where_it_is(
    client: httpx.AsyncClient, path: str, body: dict, param: str
) -> None:
    """A lone surrogate (valid JSON as an escape, but no UTF-8 text) could reach neither the
    tokenizer nor the workers: it is refused at the door, on every route."""
    r = await client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
    tgi = path.startswith("/generate")
    if tgi:
        assert_tgi_error(r, 422, param=param, says="lone surrogate")
    else:
        assert_error(r, 400, param=param, says="not valid Unicode: it holds a lone surrogate")
    good = {"inputs": "ok"} if tgi else {"prompt": "x"}
    if path == CHAT:
        good = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    assert (await client.post(path, json=good)).status_code == 200


async def test_harmless_or_null_extra_fields_are_accepted(client: httpx.AsyncClient) -> None:
    body = {**GOOD, "user": "u1", "metadata": {"k": "v"}, "min_p": None, "tool_choice": None}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text


async def test_an_assistant_message_echoed_back_with_its_unused_fields_is_accepted(
    client: httpx.AsyncClient,
) -> None:
    """What the openai client sends when a reply's message object goes back into the
    conversation: its unused fields null or empty."""
    echoed = {"role": "assistant", "content": "hi", "refusal": None, "tool_calls": None, "annotations": []}
    messages = [{"role": "user", "content": "x"}, echoed, {"role": "user", "content": "y"}]
    r = await client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
    assert r.status_code == 200, r.text


async def test_stream_options_as_openai_documents_them_are_accepted(client: httpx.AsyncClient) -> None:
    """`include_obfuscation: false` is what OpenAI's docs suggest, and what this server does."""
    options = {"include_usage": True, "include_obfuscation": False}
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "stream": True}
    r = await client.post("/v1/chat/completions", json=body | {"stream_options": options})
    assert r.status_code == 200, r.text


async def test_completion_logprobs_is_a_count_not_a_flag(client: httpx.AsyncClient) -> None:
    assert_error(await client.post("/v1/completions", json={**GOOD, "logprobs": True}), 400, param="logprobs")


async def test_unknown_path_and_method(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/v1/engines"), 404, says="no such endpoint")
    assert_error(await client.get("/v1/completions"), 405, says="method not allowed")
    assert (await client.post("/v1/completions", json=GOOD)).status_code == 200


async def test_unexpected_exception_is_a_500_json(fake: FakeBackend) -> None:
    def broken_encode(text: str) -> list[int]:
        raise RuntimeError("tokenizer exploded")

    app = create_app(fake)
    transport = httpx.ASGITransport(app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as client:
        fake.encode = broken_encode  # type: ignore[method-assign]
        error = assert_error(await client.post("/v1/completions", json=GOOD), 500, says="RuntimeError")
        assert error["type"] == "server_error"
        assert "exploded" not in error["message"]  # internals stay in the server log
        del fake.encode
        assert (await client.post("/v1/completions", json=GOOD)).status_code == 200


async def test_backend_failure_before_the_first_output_is_a_500(fake: FakeBackend) -> None:
    async def failing_generate(*args: object, **kwargs: object) -> object:
        raise RuntimeError("no instance")
        yield  # an async generator

    fake.generate = failing_generate  # type: ignore[method-assign,assignment]
    transport = httpx.ASGITransport(create_app(fake), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as client:
        assert_error(await client.post("/v1/completions", json=GOOD | {"stream": True}), 500)
    assert len(fake.aborted) == 1  # an unexpected failure still frees what the request held


async def test_a_backend_that_raises_when_called_is_a_500_not_a_hang(fake: FakeBackend) -> None:
    def broken_generate(*args: object, **kwargs: object) -> object:
        raise RuntimeError("broken before any output")

    fake.generate = broken_generate  # type: ignore[method-assign,assignment]
    transport = httpx.ASGITransport(create_app(fake), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as client:
        with anyio.fail_after(60):  # (the request's reader used to wait forever)
            for body in (GOOD, GOOD | {"stream": True}):
                assert_error(await client.post("/v1/completions", json=body), 500)


async def test_failure_mid_stream_is_an_error_event(client: httpx.AsyncClient, fake: FakeBackend) -> None:
    fake.fail_after = 2
    r = await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 10, "stream": True})
    assert r.status_code == 200  # already sent when the failure came
    *chunks, error = sse_json(r.text)
    assert [c["choices"][0]["text"] for c in chunks] == ["h", "e"]
    assert error["error"]["type"] == "server_error"
    assert fake.aborted == [chunks[0]["id"]]
    fake.fail_after = None
    assert (await client.post("/v1/completions", json=GOOD)).status_code == 200


async def test_failure_mid_tgi_stream_is_an_error_event(client: httpx.AsyncClient, fake: FakeBackend) -> None:
    fake.fail_after = 1
    r = await client.post("/generate_stream", json={"inputs": "hello", "parameters": {"max_new_tokens": 5}})
    events = [json.loads(e[len("data: ") :]) for e in r.text.strip().split("\n\n")]
    assert events[0]["token"]["text"] == "h"
    assert events[-1]["error_type"] == "generation" and "internal server error" in events[-1]["error"]


async def test_a_body_that_is_not_json_says_why(client: httpx.AsyncClient) -> None:
    """JSON under another Content-Type is a 415 naming it; bytes that are not UTF-8 say so
    (FastAPI's own texts, "Input should be a valid dictionary" and "There was an error
    parsing the body", named neither)."""
    body = json.dumps(GOOD)
    r = await client.post("/v1/completions", content=body, headers={"content-type": "text/plain"})
    assert_error(r, 415, says="Content-Type application/json, not text/plain")
    r = await client.post(
        "/v1/completions", content=b'{"prompt": "\xff\xfe"}', headers={"content-type": "application/json"}
    )
    assert_error(r, 400, says="could not be read as JSON: it must be UTF-8 text")
    for kind in ("application/json; charset=utf-8", "application/vnd.api+json"):
        assert (
            await client.post("/v1/completions", content=body, headers={"content-type": kind})
        ).status_code == 200


async def test_max_completion_tokens_below_one_is_named_as_sent(client: httpx.AsyncClient) -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "max_completion_tokens": 0}
    assert_error(
        await client.post("/v1/chat/completions", json=body), 400, param="max_completion_tokens", says="got 0"
    )
