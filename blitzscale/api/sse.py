"""Server-sent events: encoding one event, and a streaming response that notices disconnects.

Starlette's `StreamingResponse` only notices a client that left when the server reports it
on `receive` (ASGI < 2.4) or when `send` raises (ASGI >= 2.4, and uvicorn's `send` silently
drops data for a closed connection instead). This response always watches `receive` next to
the stream, and runs `on_close` when the stream ends for any reason, so the request it
serves is aborted as soon as the client goes, even while no token is being sent.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from blitzscale.api.generation import wait_for_disconnect

DONE_EVENT = "data: [DONE]\n\n"


def sse_event(payload: BaseModel | dict[str, Any]) -> str:
    """One `data:` event; compact JSON (one line, as the SSE format requires)."""
    if isinstance(payload, BaseModel):
        return f"data: {payload.model_dump_json()}\n\n"
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


class EventStreamResponse(StreamingResponse):
    """`text/event-stream` of `events`; `on_close` runs once when the stream is over (finished,
    failed, or the client disconnected) in the response's own task, so it can await freely."""

    def __init__(
        self,
        events: AsyncIterator[str],
        on_close: Callable[[], Awaitable[None]],
        headers: Mapping[str, str] | None = None,
    ) -> None:
        # no-cache and no proxy buffering: each event must reach the client when it is made
        base = {"cache-control": "no-cache", "x-accel-buffering": "no"}
        super().__init__(events, headers=base | dict(headers or {}), media_type="text/event-stream")
        self.events = events
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        stream = asyncio.create_task(self.stream_response(send))
        watch = asyncio.create_task(wait_for_disconnect(receive))
        try:
            done, _ = await asyncio.wait((stream, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (stream, watch):
                task.cancel()
            await asyncio.gather(stream, watch, return_exceptions=True)
            aclose = getattr(self.events, "aclose", None)
            if aclose is not None:  # stopped at a `yield` (cancelled in `send`): run its finally
                await aclose()
            await self.on_close()
        error = stream.exception() if stream in done else None
        if error is not None and not isinstance(error, OSError):  # OSError from `send`: client gone
            raise error  # what broke the stream, for the server's log
