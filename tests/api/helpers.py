"""Small shared helpers of the API tests."""

from __future__ import annotations

import json
from typing import Any

import httpx


def sse_data(body: str) -> list[str]:
    """The `data:` payloads of an SSE body, in order; checks events are `data: ...\\n\\n`."""
    events = body.split("\n\n")
    assert events[-1] == "", f"stream does not end with a blank line: {body[-80:]!r}"
    payloads = []
    for event in events[:-1]:
        assert event.startswith("data: "), f"not a data event: {event!r}"
        assert "\n" not in event, f"event spans lines: {event!r}"
        payloads.append(event[len("data: ") :])
    return payloads


def sse_json(body: str) -> list[dict[str, Any]]:
    """The JSON events of an OpenAI stream, checking it ends with `[DONE]` (and only once)."""
    payloads = sse_data(body)
    assert payloads[-1] == "[DONE]"
    assert payloads.count("[DONE]") == 1
    return [json.loads(p) for p in payloads[:-1]]


def assert_tgi_error(
    response: httpx.Response, status: int, *, param: str | None = None, says: str = ""
) -> dict:
    """A TGI-style error body (`{"error": text, "error_type": kind}`) with `status`; the
    text names `param` when given."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "error_type"}, body
    assert isinstance(body["error"], str) and body["error"]
    assert body["error_type"] == ("validation" if status < 500 and status != 429 else body["error_type"])
    assert says.lower() in body["error"].lower(), body["error"]
    if param is not None:
        assert param in body["error"], body
    return body


def assert_error(response: httpx.Response, status: int, *, param: str | None = None, says: str = "") -> dict:
    """An OpenAI-style error body with `status`; returns its `error` object."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert says.lower() in error["message"].lower(), error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error
