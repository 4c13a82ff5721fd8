"""When the server stops serving (`app.state.stopping`, set by `serve` just before its
graceful shutdown runs out), requests still running end with a 503, a stream with its error
event, and are aborted on the backend, rather than being cancelled mid-write."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from blitzscale.api.app import create_app

from .conftest import BASE_URL
from .fake_backend import FakeBackend
from .helpers import assert_error, assert_tgi_error, sse_data

pytestmark = pytest.mark.anyio

LIMIT_S = 60  # generous: a loaded machine
LONG = {"prompt": "hello", "max_tokens": 5000, "ignore_eos": True}


async def _stopped_while_running(path: str, body: dict) -> tuple[httpx.Response, FakeBackend]:
    fake = FakeBackend(max_model_len=10_000, token_delay_s=0.002)
    app = create_app(fake)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url=BASE_URL) as client:
        call = asyncio.create_task(client.post(path, json=body, timeout=LIMIT_S))
        async with asyncio.timeout(LIMIT_S):
            # an output made: the route reads it before the stop (in order), so a stream has
            # begun when the stop comes (before that, a request is answered with a plain 503)
            while not fake.num_outputs:
                await asyncio.sleep(0.01)
        app.state.stopping.set()
        async with asyncio.timeout(LIMIT_S):
            response = await call
    return response, fake


@pytest.mark.parametrize("stream", [True, False])
async def test_openai_requests_still_running_end_with_a_503(stream: bool) -> None:
    r, fake = await _stopped_while_running("/v1/completions", LONG | {"stream": stream})
    if stream:
        assert r.status_code == 200
        events = sse_data(r.text)
        last = json.loads(events[-2] if events[-1] == "[DONE]" else events[-1])
        assert "shutting down" in last["error"]["message"], events[-3:]
    else:
        assert_error(r, 503, says="shutting down")
    assert fake.aborted and not fake.running  # the backend was told


async def test_a_tgi_stream_ends_with_its_error_event() -> None:
    body = {"inputs": "hello", "parameters": {"max_new_tokens": 5000, "ignore_eos": True}}
    r, fake = await _stopped_while_running("/generate_stream", body)
    last = json.loads(sse_data(r.text)[-1])
    assert set(last) == {"error", "error_type"} and "shutting down" in last["error"], last
    assert fake.aborted and not fake.running
    r, _ = await _stopped_while_running("/generate", body)
    assert_tgi_error(r, 503, says="shutting down")
