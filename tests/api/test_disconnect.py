"""A client that goes away has its request aborted on the backend (its KV blocks freed),
whether it leaves mid-stream, while queued, or while waiting for a whole response."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
from starlette.types import Message

from blitzscale.api.app import create_app

from .fake_backend import FakeBackend
from .live_server import live_server, wait_until

LONG = {"prompt": "hello", "max_tokens": 5000, "ignore_eos": True}


@pytest.fixture
def slow_fake() -> FakeBackend:
    return FakeBackend(max_model_len=10_000, token_delay_s=0.01)


@pytest.fixture
def server(slow_fake: FakeBackend) -> Iterator[str]:
    with live_server(create_app(slow_fake)) as url:
        yield url


def assert_aborted_and_still_serving(fake: FakeBackend, url: str) -> None:
    assert wait_until(lambda: len(fake.aborted) == 1 and not fake.running), (fake.aborted, fake.running)
    assert fake.aborted == [fake.calls[0].request_id]
    fake.hold = False
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "ok", "max_tokens": 2}, timeout=5)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "ok"
    assert len(fake.aborted) == 1


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", LONG | {"stream": True}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True}),
        ("/generate_stream", {"inputs": "hello", "parameters": {"max_new_tokens": 5000, "ignore_eos": True}}),
    ],
)
def test_disconnect_mid_stream_aborts(slow_fake: FakeBackend, server: str, path: str, body: dict) -> None:
    with httpx.Client(base_url=server, timeout=5) as client, client.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        while not next(lines).startswith("data:"):
            pass
        assert slow_fake.aborted == []
    assert_aborted_and_still_serving(slow_fake, server)


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_while_queued_aborts(slow_fake: FakeBackend, server: str, stream: bool) -> None:
    """No output yet (so no headers sent): the disconnect is still noticed and aborts."""
    slow_fake.hold = True
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server}/v1/completions", json=LONG | {"stream": stream}, timeout=0.3)
    assert_aborted_and_still_serving(slow_fake, server)


def test_disconnect_while_waiting_for_a_whole_response_aborts(slow_fake: FakeBackend, server: str) -> None:
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{server}/generate", json={"inputs": "hi", "parameters": {"max_new_tokens": 5000}}, timeout=0.3
        )
    assert_aborted_and_still_serving(slow_fake, server)


@pytest.mark.anyio
async def test_disconnect_through_plain_asgi() -> None:
    """The same without a server: the ASGI receive channel reports the disconnect."""
    fake = FakeBackend(max_model_len=10_000, token_delay_s=0.005)
    app = create_app(fake)
    gone = asyncio.Event()
    sent: list[Message] = []
    body = json.dumps(LONG | {"stream": True}).encode()
    requested = False

    async def receive() -> Message:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and b"data:" in message.get("body", b""):
            gone.set()  # the client leaves after its first event

    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": "POST", "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
        "query_string": b"", "root_path": "", "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
    }  # fmt: skip
    await asyncio.wait_for(app(scope, receive, send), timeout=5)
    assert sent[0]["status"] == 200
    assert fake.aborted == [fake.calls[0].request_id] and not fake.running
    assert len([m for m in sent if m["type"] == "http.response.body"]) < 10  # stopped early
