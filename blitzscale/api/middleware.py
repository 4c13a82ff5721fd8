"""Plain ASGI middlewares: count every answered request, limit body sizes, check the API key.

Plain ASGI rather than Starlette's `BaseHTTPMiddleware`, which buffers and re-wraps
streaming bodies and hides client disconnects from the endpoint.
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from blitzscale.api.errors import TGI_PATHS, error_body, tgi_error_body
from blitzscale.api.metrics import ApiMetrics

UNMATCHED_ENDPOINT = "unmatched"  # one label for every unknown path: paths are unbounded
DEFAULT_MAX_BODY_BYTES = 2 << 20


class RequestCounterMiddleware:
    """Counts each HTTP request under its route path and the status it was answered with.

    The status is the one sent at response start, so a stream that fails after its first
    event counts as 200; an exception before any response counts as 500.
    """

    def __init__(self, app: ASGIApp, metrics: ApiMetrics, endpoints: frozenset[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.endpoints = endpoints

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        path = scope["path"]
        try:
            await self.app(scope, receive, send_and_note)
        finally:
            endpoint = path if path in self.endpoints else UNMATCHED_ENDPOINT
            self.metrics.count_request(endpoint, status)


class ApiKeyMiddleware:
    """Answers 401 unless `Authorization: Bearer <api_key>`; `open_paths` need no key.

    A middleware rather than a route dependency so the key is checked before the body is
    read: an unauthenticated client gets 401 even for a malformed body, and costs no parsing.
    """

    def __init__(self, app: ASGIApp, api_key: str, open_paths: frozenset[str]) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths or self._is_authorized(scope):
            await self.app(scope, receive, send)
            return
        await _send_401(send, tgi=scope["path"] in TGI_PATHS)

    def _is_authorized(self, scope: Scope) -> bool:
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        scheme, _, token = given.partition(b" ")
        normalized = b"Bearer " + token.strip() if scheme.lower() == b"bearer" else b""
        return hmac.compare_digest(normalized, self.expected)


async def _send_401(send: Send, tgi: bool = False) -> None:
    """(TGI's routes answer in TGI's error shape, as every other error of theirs)"""
    message = "missing or wrong API key (send `Authorization: Bearer <key>`)"
    shaped = tgi_error_body(401, message) if tgi else error_body(401, message, code="invalid_api_key")
    body = json.dumps(shaped).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", b"Bearer"),
    ]
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    """Answers 413 for a body over `max_bytes`, before the app parses any of it: by its
    Content-Length when given, else by counting the chunks as they arrive (buffered, then
    handed on)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None:
            if not length.isdigit() or int(length) > self.max_bytes:
                await self._refuse(send, length.decode(errors="replace"))
                return
            await self.app(scope, receive, send)
            return
        chunks: list[Message] = []
        total = 0
        while True:
            message = await receive()
            chunks.append(message)
            if message["type"] != "http.request":
                break
            total += len(message.get("body", b""))
            if total > self.max_bytes:
                await self._refuse(send, f"more than {total}")
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return chunks.pop(0) if chunks else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send, size: str) -> None:
        text = f"the request body is too large ({size} bytes; at most {self.max_bytes})"
        body = json.dumps(error_body(413, text)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})
