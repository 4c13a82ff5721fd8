"""TGI's /generate and /generate_stream: bodies, parameter mapping, timing headers."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from blitzscale.api.app import create_app
from blitzscale.core.sampling import SamplingParams

from .conftest import BASE_URL
from .fake_backend import FakeBackend
from .helpers import assert_tgi_error, sse_data

pytestmark = pytest.mark.anyio

TIMING_HEADERS = (
    "x-first-token-time",
    "x-total-time",
    "x-queue-time",
    "x-inference-time",
    "x-max-time-between-tokens",
    "x-avg-time-between-tokens",
    "x-p99-time-between-tokens",
    "x-output-length",
)


def ms(headers: httpx.Headers, name: str) -> int:
    value = headers[name]
    assert value.isdigit(), f"{name}: {value!r} is not integer milliseconds"
    return int(value)


def tgi_events(body: str) -> list[dict[str, Any]]:
    return [json.loads(p) for p in sse_data(body)]


async def test_generate(client: httpx.AsyncClient, fake: FakeBackend) -> None:
    r = await client.post("/generate", json={"inputs": "hello", "parameters": {"max_new_tokens": 4}})
    assert r.status_code == 200
    assert r.json() == {"generated_text": "hell"}
    assert r.headers["x-request-id"] == fake.calls[0].request_id
    assert fake.calls[0].params == SamplingParams(max_tokens=4, temperature=0.0)  # greedy by default


async def test_generate_details_and_full_text(client: httpx.AsyncClient) -> None:
    params = {"max_new_tokens": 3, "details": True, "return_full_text": True, "seed": 7, "do_sample": True}
    body = (await client.post("/generate", json={"inputs": "abc", "parameters": params})).json()
    assert body["generated_text"] == "abcabc"
    details = body["details"]
    assert details["finish_reason"] == "length"
    assert (details["generated_tokens"], details["input_length"], details["seed"]) == (3, 3, 7)
    assert details["timings"]["output_length"] == 3


async def test_generate_timing_headers_are_sane(fake: FakeBackend) -> None:
    fake.token_delay_s = 0.01
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(create_app(fake)), base_url=BASE_URL
    ) as client:
        r = await client.post("/generate", json={"inputs": "abcdef", "parameters": {"max_new_tokens": 6}})
    h = r.headers
    for name in TIMING_HEADERS:
        ms(h, name)
    assert ms(h, "x-output-length") == 6
    assert 0 <= ms(h, "x-queue-time") <= ms(h, "x-first-token-time") <= ms(h, "x-total-time")
    assert ms(h, "x-inference-time") == pytest.approx(ms(h, "x-total-time") - ms(h, "x-queue-time"), abs=1)
    assert ms(h, "x-total-time") >= 60  # six outputs, 10 ms apart
    avg, p99, most = (ms(h, f"x-{k}-time-between-tokens") for k in ("avg", "p99", "max"))
    assert 8 <= avg <= p99 <= most


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ({}, SamplingParams(max_tokens=100, temperature=0.0)),
        ({"do_sample": False, "temperature": 1.0}, SamplingParams(max_tokens=100, temperature=0.0)),
        ({"temperature": 0.7, "seed": 3}, SamplingParams(max_tokens=100, temperature=0.7, seed=3)),
        ({"top_k": 5, "top_p": 0.5}, SamplingParams(max_tokens=100, top_k=5, top_p=0.5)),
        ({"do_sample": True, "stop": ["zz"], "ignore_eos": True},
         SamplingParams(max_tokens=100, stop=("zz",), ignore_eos=True)),
    ],
)  # fmt: skip
async def test_parameters_map_like_tgi(
    client: httpx.AsyncClient, fake: FakeBackend, parameters: dict, expected: SamplingParams
) -> None:
    fake.max_model_len = 1000
    r = await client.post("/generate", json={"inputs": "hi", "parameters": parameters})
    assert r.status_code == 200
    assert fake.calls[0].params == expected


async def test_generate_stream_events(client: httpx.AsyncClient) -> None:
    body = {"inputs": "hello", "parameters": {"max_new_tokens": 3, "details": True}}
    r = await client.post("/generate_stream", json=body)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = tgi_events(r.text)
    assert [e["index"] for e in events] == [1, 2, 3]
    assert [e["token"] for e in events] == [
        {"id": ord(c), "text": c, "logprob": None, "special": False} for c in "hel"
    ]
    assert [e["generated_text"] for e in events] == [None, None, "hel"]
    assert events[0]["details"] is None and events[1]["details"] is None
    details = events[-1]["details"]
    assert (details["finish_reason"], details["generated_tokens"], details["input_length"]) == (
        "length",
        3,
        5,
    )
    assert set(details["timings"]) >= {
        "queue_time",
        "first_token_time",
        "total_time",
        "p99_time_between_tokens",
    }


async def test_stream_headers_are_what_is_known_at_the_start(fake: FakeBackend) -> None:
    """Headers go out with the first event: later timings are only in the final details."""
    fake.token_delay_s = 0.02
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(create_app(fake)), base_url=BASE_URL
    ) as client:
        r = await client.post(
            "/generate_stream", json={"inputs": "hello", "parameters": {"max_new_tokens": 4, "details": True}}
        )
    assert r.headers["x-request-id"].startswith("gen-")
    assert 0 <= ms(r.headers, "x-queue-time") <= ms(r.headers, "x-first-token-time")
    assert "x-total-time" not in r.headers and "x-output-length" not in r.headers
    timings = tgi_events(r.text)[-1]["details"]["timings"]
    assert timings["output_length"] == 4
    assert timings["first_token_time"] <= timings["total_time"]
    assert timings["avg_time_between_tokens"] >= 15


async def test_one_event_per_token_when_outputs_hold_several(
    client: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.tokens_per_output = 2
    r = await client.post("/generate_stream", json={"inputs": "abcd", "parameters": {"max_new_tokens": 4}})
    events = tgi_events(r.text)
    assert [(e["token"]["id"], e["token"]["text"]) for e in events] == [
        (ord("a"), ""), (ord("b"), "ab"), (ord("c"), ""), (ord("d"), "cd"),
    ]  # fmt: skip
    assert events[-1]["generated_text"] == "abcd"


@pytest.mark.parametrize(
    ("inputs", "stop", "reason"),
    [("ab#", None, "eos_token"), ("hello world", ["wo"], "stop_sequence"), ("abc", None, "length")],
)
async def test_finish_reasons(
    client: httpx.AsyncClient, inputs: str, stop: list[str] | None, reason: str
) -> None:
    params = {"max_new_tokens": 10 if stop else 5, "stop": stop, "details": True}
    r = await client.post("/generate_stream", json={"inputs": inputs, "parameters": params})
    assert tgi_events(r.text)[-1]["details"]["finish_reason"] == reason


async def test_backend_queue_time_hook_is_used(fake: FakeBackend) -> None:
    class WithQueueTime(FakeBackend):
        def queue_time_s(self, request_id: str) -> float | None:
            return 0.25

    app = create_app(WithQueueTime())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url=BASE_URL) as client:
        r = await client.post("/generate", json={"inputs": "abc", "parameters": {"max_new_tokens": 2}})
    assert r.headers["x-queue-time"] == "250"


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"inputs": ""}, "inputs", "empty"),
        (
            {"inputs": "a", "parameters": {"max_new_tokens": 0}},
            "parameters.max_new_tokens",
            "parameters.max_new_tokens must be at least 1",
        ),
        # never cut short: 128 tokens of context (the fake's)
        ({"inputs": "a", "parameters": {"max_new_tokens": 100000}}, "parameters.max_new_tokens", "at most"),
        ({"inputs": "a", "parameters": {"max_new_tokens": "5"}}, "parameters.max_new_tokens", "integer"),
        # nothing a client sends is dropped unseen
        ({"inputs": "a", "bogus": 1}, "bogus", "extra"),
        ({"inputs": "a", "add_special_tokens": False}, "add_special_tokens", "not supported"),
        ({"inputs": "a", "parameters": {"max_new_tokens": 2, "bogus": 1}}, "parameters.bogus", "extra"),
        ({"inputs": "a", "parameters": {"top_p": 0, "do_sample": True}}, None, "top_p"),
        ({"parameters": {}}, "inputs", "field required"),
    ],
)
@pytest.mark.parametrize("path", ["/generate", "/generate_stream"])
async def test_tgi_errors(
    client: httpx.AsyncClient, path: str, body: dict, param: str | None, says: str
) -> None:
    assert_tgi_error(await client.post(path, json=body), 422, param=param, says=says)  # (TGI's status)
    assert (await client.post(path, json={"inputs": "ok"})).status_code == 200


async def test_add_special_tokens_as_the_tokenizer_does_is_accepted(client: httpx.AsyncClient) -> None:
    body = {"inputs": "a", "add_special_tokens": True, "parameters": {"max_new_tokens": 2}}
    assert (await client.post("/generate", json=body)).status_code == 200


async def test_a_stream_flag_must_name_the_route(client: httpx.AsyncClient) -> None:
    """huggingface_hub sends `stream`; it must agree with the route it is sent to."""
    body = {"inputs": "a", "parameters": {"max_new_tokens": 2}}
    r = await client.post("/generate", json={**body, "stream": True})
    assert_tgi_error(r, 422, param="stream", says="/generate_stream")
    assert (await client.post("/generate", json={**body, "stream": False})).status_code == 200
    assert (await client.post("/generate_stream", json={**body, "stream": True})).status_code == 200


async def test_info_names_the_model_and_its_limits(client: httpx.AsyncClient, fake: FakeBackend) -> None:
    info = (await client.get("/info")).json()
    assert info["model_id"] == "fake-model" and info["router"] == "blitzscale"
    assert (info["max_input_tokens"], info["max_total_tokens"]) == (127, 128)
    assert info["max_best_of"] == 1 and info["version"]


async def test_details_carry_tokens_and_prefill(client: httpx.AsyncClient) -> None:
    body = {
        "inputs": "abc",
        "parameters": {"max_new_tokens": 4, "details": True, "decoder_input_details": True},
    }
    details = (await client.post("/generate", json=body)).json()["details"]
    assert [(t["id"], t["text"]) for t in details["tokens"]] == [(ord(c), c) for c in "abca"]
    assert [(t["id"], t["text"]) for t in details["prefill"]] == [(ord(c), c) for c in "abc"]
    plain = {"inputs": "abc", "parameters": {"max_new_tokens": 4, "details": True}}
    assert (await client.post("/generate", json=plain)).json()["details"]["prefill"] == []
    # as TGI: asking for the prompt's tokens asks for details
    alone = {"inputs": "abc", "parameters": {"max_new_tokens": 4, "decoder_input_details": True}}
    assert len((await client.post("/generate", json=alone)).json()["details"]["prefill"]) == 3


async def test_a_stream_carries_details_only_when_asked_and_never_the_prompts_tokens(
    client: httpx.AsyncClient,
) -> None:
    """As TGI: the last event's `details` are null unless asked for; `decoder_input_details`
    cannot be streamed, and is refused rather than answered with an empty prefill."""
    plain = {"inputs": "hello", "parameters": {"max_new_tokens": 2}}
    events = tgi_events((await client.post("/generate_stream", json=plain)).text)
    assert events[-1]["generated_text"] == "he" and events[-1]["details"] is None
    prefill = {"inputs": "hello", "parameters": {"max_new_tokens": 2, "decoder_input_details": True}}
    r = await client.post("/generate_stream", json=prefill)
    assert_tgi_error(r, 422, param="parameters.decoder_input_details", says="not supported when streaming")


@pytest.mark.parametrize("path", ["/generate", "/generate_stream"])
async def test_sampling_asked_for_at_temperature_zero_is_refused(
    client: httpx.AsyncClient, path: str
) -> None:
    """`do_sample` with a temperature of 0 asks for two things at once (TGI refuses it);
    temperature 0 alone is greedy decoding."""
    body = {"inputs": "a", "parameters": {"max_new_tokens": 2, "do_sample": True, "temperature": 0}}
    assert_tgi_error(await client.post(path, json=body), 422, param="parameters.temperature", says="positive")
    body["parameters"]["do_sample"] = False
    assert (await client.post(path, json=body)).status_code == 200


@pytest.mark.parametrize(
    ("parameters", "param"),
    [
        ({"watermark": True}, "parameters.watermark"),
        ({"truncate": 0}, "parameters.truncate"),
        ({"typical_p": 0.5}, "parameters.typical_p"),
        ({"best_of": 2}, "parameters.best_of"),
        ({"top_n_tokens": -1}, "parameters.top_n_tokens"),
        ({"grammar": {"type": "ebnf", "value": "root ::= 'a'"}}, "parameters.grammar.type"),
        ({"grammar": {"type": "regex", "value": ""}}, "parameters.grammar.value"),
        ({"grammar": {"type": "json", "value": "{oops"}}, "parameters.grammar.value"),
        ({"grammar": {"type": "regex", "value": "a", "flags": "i"}}, "parameters.grammar.flags"),
        ({"frequency_penalty": 3.0}, "parameters.frequency_penalty"),
        ({"repetition_penalty": 0}, "parameters.repetition_penalty"),
    ],
)
async def test_tgi_knobs_we_lack_and_bad_grammars_are_refused(
    client: httpx.AsyncClient, parameters: dict, param: str
) -> None:
    assert_tgi_error(
        await client.post("/generate", json={"inputs": "a", "parameters": parameters}), 422, param=param
    )


async def test_a_generate_run_again_reports_its_last_run_only(
    client: httpx.AsyncClient, fake: FakeBackend
) -> None:
    """/generate reads only the whole answer: a backend that runs it again after two outputs
    (an instance died) gives the last run's text, token count and timing length."""
    fake.restart_after = 2
    params = {"max_new_tokens": 3, "details": True}
    r = await client.post("/generate", json={"inputs": "abc", "parameters": params})
    body = r.json()
    assert body["generated_text"] == "abc" and fake.calls[0].stream is False
    assert body["details"]["generated_tokens"] == 3 and body["details"]["timings"]["output_length"] == 3
