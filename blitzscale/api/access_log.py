"""One access-log line per HTTP request: method, path, status, duration, and the prompt and
generated tokens of the generations it ran (the routes list them in the request's state,
`generations`; a stream counts once it has ended).

Text: `POST /v1/completions 200 812.4ms prompt=5 completion=16 id=cmpl-...`. With the JSON
format (`blitzscale serve --log-format json`) every log line is one JSON object and an
access line carries the same fields as keys (`JsonFormatter`).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

ACCESS_LOGGER = "blitzscale.access"


def note_generations(scope: Scope, gens: list[Any], prompt_tokens: int | None = None) -> None:
    """Called by a route: these generations' tokens belong to this request's log line;
    `prompt_tokens`: the request's (a batch's prompts together; by default the first
    generation's, which every choice of one prompt shares)."""
    state = scope.setdefault("state", {})
    state.setdefault("generations", []).extend(gens)
    if prompt_tokens is not None:
        state["prompt_tokens"] = prompt_tokens


class AccessLogMiddleware:
    def __init__(self, app: ASGIApp, logger: logging.Logger) -> None:
        self.app = app
        self.logger = logger

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            self._log(scope, status, (time.perf_counter() - start) * 1000)

    def _log(self, scope: Scope, status: int, ms: float) -> None:
        state = scope.get("state") or {}
        gens = state.get("generations", [])
        fields: dict[str, Any] = {
            "method": scope.get("method", ""),
            "path": scope.get("path", ""),
            "status": status,
            "duration_ms": round(ms, 1),
            "prompt_tokens": state.get("prompt_tokens", gens[0].num_prompt_tokens if gens else 0),
            "completion_tokens": sum(g.num_output_tokens for g in gens),
        }
        if gens:
            fields["request_id"] = (
                gens[0].request_id.rsplit("-", 1)[0] if len(gens) > 1 else gens[0].request_id
            )
        text = (
            f"{fields['method']} {fields['path']} {status} {fields['duration_ms']}ms "
            f"prompt={fields['prompt_tokens']} completion={fields['completion_tokens']}"
        )
        if "request_id" in fields:
            text += f" id={fields['request_id']}"
        self.logger.info(text, extra={"access": fields})


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and an access line's fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update(getattr(record, "access", {}))
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)
