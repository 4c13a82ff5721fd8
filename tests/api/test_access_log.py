"""One access-log line per request (method, path, status, duration, tokens), as text or JSON."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from blitzscale.api.access_log import ACCESS_LOGGER, JsonFormatter
from blitzscale.api.app import create_app

from .conftest import BASE_URL
from .fake_backend import FakeBackend

pytestmark = pytest.mark.anyio


async def test_one_line_per_request_with_status_and_tokens(caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(FakeBackend(), access_log=logging.getLogger(ACCESS_LOGGER), api_key="k")
    auth = {"authorization": "Bearer k"}
    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url=BASE_URL) as c:
            await c.post("/v1/completions", json={"prompt": "hello", "max_tokens": 3}, headers=auth)
            await c.post(
                "/v1/completions",
                json={"prompt": "hey", "max_tokens": 2, "n": 2, "stream": True},
                headers=auth,
            )
            await c.post("/v1/completions", json={"prompt": "x", "presence_penalty": 9}, headers=auth)
            batch = {"prompt": ["ab", "cde"], "max_tokens": 2, "n": 2}
            await c.post("/v1/completions", json=batch, headers=auth)
            await c.get("/health")
            await c.get("/v1/models")  # no key: 401, logged too
    records = [r for r in caplog.records if r.name == ACCESS_LOGGER]
    fields = [r.access for r in records]  # type: ignore[attr-defined]
    assert [(f["method"], f["path"], f["status"]) for f in fields] == [
        ("POST", "/v1/completions", 200),
        ("POST", "/v1/completions", 200),
        ("POST", "/v1/completions", 400),
        ("POST", "/v1/completions", 200),
        ("GET", "/health", 200),
        ("GET", "/v1/models", 401),
    ]
    assert (fields[0]["prompt_tokens"], fields[0]["completion_tokens"]) == (5, 3)
    assert (fields[1]["prompt_tokens"], fields[1]["completion_tokens"]) == (3, 4)  # two choices
    assert fields[2]["completion_tokens"] == 0 and all(f["duration_ms"] >= 0 for f in fields)
    assert (fields[3]["prompt_tokens"], fields[3]["completion_tokens"]) == (5, 8)  # each prompt once
    assert records[0].getMessage().startswith("POST /v1/completions 200 ")
    assert "prompt=5 completion=3 id=cmpl-" in records[0].getMessage()
    line = json.loads(JsonFormatter().format(records[0]))
    assert line["status"] == 200 and line["logger"] == ACCESS_LOGGER and line["completion_tokens"] == 3
