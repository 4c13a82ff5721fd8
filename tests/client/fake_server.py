"""A fake streaming LLM server on 127.0.0.1 (port chosen by the OS), run in a thread.

It speaks both replay protocols, waits `ttft_s` before the first token and `tbt_s` between
tokens, and records when each request arrived (perf_counter: the same clock the client
uses, since both run in this process).
"""

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tests.api.live_server import live_server


@dataclass(frozen=True)
class Behaviour:
    ttft_s: float = 0.0
    tbt_s: float = 0.0
    status: int = 200
    queue_time_ms: str | None = None


@dataclass(frozen=True)
class Received:
    time: float
    path: str
    body: dict
    headers: dict[str, str]


@dataclass
class FakeServer:
    url: str
    received: list[Received] = field(default_factory=list)


def _sse(obj: object) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def _make_app(behaviour: Behaviour, received: list[Received]) -> FastAPI:
    app = FastAPI()
    headers = {"x-queue-time": behaviour.queue_time_ms} if behaviour.queue_time_ms else {}

    async def tokens(count: int) -> AsyncIterator[int]:
        await asyncio.sleep(behaviour.ttft_s)
        for i in range(count):
            if i:
                await asyncio.sleep(behaviour.tbt_s)
            yield i

    async def openai_events(body: dict) -> AsyncIterator[str]:
        n = body["max_tokens"]
        async for _ in tokens(n):
            yield _sse({"choices": [{"index": 0, "text": " tok"}]})
        usage = {"prompt_tokens": len(body["prompt"].split()), "completion_tokens": n}
        yield _sse({"choices": [], "usage": usage})
        yield "data: [DONE]\n\n"

    async def tgi_events(body: dict) -> AsyncIterator[str]:
        n = body["parameters"]["max_new_tokens"]
        async for i in tokens(n):
            last = i == n - 1
            yield _sse(
                {
                    "token": {"id": i, "text": " tok", "special": False},
                    "generated_text": " tok" * n if last else None,
                    "details": {"generated_tokens": n} if last else None,
                }
            )

    async def handle(request: Request, events: Callable[[dict], AsyncIterator[str]]) -> Response:
        body = await request.json()
        received.append(Received(time.perf_counter(), request.url.path, body, dict(request.headers)))
        if behaviour.status != 200:
            return JSONResponse({"error": "injected failure"}, status_code=behaviour.status)
        return StreamingResponse(events(body), media_type="text/event-stream", headers=headers)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await handle(request, openai_events)

    @app.post("/generate_stream")
    async def generate_stream(request: Request) -> Response:
        return await handle(request, tgi_events)

    return app


@contextmanager
def run_fake_server(behaviour: Behaviour) -> Iterator[FakeServer]:
    received: list[Received] = []
    with live_server(_make_app(behaviour, received)) as url:
        yield FakeServer(url=url, received=received)
