"""API key checks, /health, /v1/models and /metrics."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import CollectorRegistry, Gauge

from blitzscale.api.app import create_app
from blitzscale.api.metrics import ApiMetrics

from .conftest import BASE_URL
from .fake_backend import FakeBackend
from .helpers import assert_error, assert_tgi_error

pytestmark = pytest.mark.anyio

KEY = "sk-test-key"
GOOD = {"prompt": "hello", "max_tokens": 2}


def client_for(app: object, **headers: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url=BASE_URL, headers=headers)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "authorization", [None, "Bearer wrong", f"Basic {KEY}", KEY, f"Bearer {KEY}x", "Bearer ", ""]
)
async def test_missing_or_wrong_key_is_401(fake: FakeBackend, authorization: str | None) -> None:
    headers = {} if authorization is None else {"authorization": authorization}
    async with client_for(create_app(fake, api_key=KEY), **headers) as client:
        error = assert_error(await client.post("/v1/completions", json=GOOD), 401, says="API key")
        assert error["code"] == "invalid_api_key"
        r = await client.post("/generate", json={"inputs": "x"})  # TGI's routes: TGI's shape
        assert_tgi_error(r, 401, says="API key")
        assert (await client.get("/v1/models")).status_code == 401
        r = await client.post("/v1/completions", content="{bad json")  # checked before parsing
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert fake.calls == []


async def test_right_key_is_served(fake: FakeBackend) -> None:
    async with client_for(create_app(fake, api_key=KEY)) as client:
        assert (await client.post("/v1/completions", json=GOOD)).status_code == 401
        headers = {"Authorization": f"Bearer {KEY}"}
        assert (await client.post("/v1/completions", json=GOOD, headers=headers)).status_code == 200
        headers = {"authorization": f"bearer {KEY}"}  # the scheme is case-insensitive
        assert (await client.post("/v1/completions", json=GOOD, headers=headers)).status_code == 200


async def test_health_and_metrics_stay_open(fake: FakeBackend) -> None:
    async with client_for(create_app(fake, api_key=KEY)) as client:
        assert (await client.get("/health")).json() == {"status": "ok", "model": "fake-model"}
        assert (await client.get("/metrics")).status_code == 200


def test_empty_key_is_refused(fake: FakeBackend) -> None:
    with pytest.raises(ValueError, match="api_key"):
        create_app(fake, api_key="")


async def test_models(client: httpx.AsyncClient) -> None:
    body = (await client.get("/v1/models")).json()
    assert body["object"] == "list"
    [card] = body["data"]
    assert (card["id"], card["object"], card["max_model_len"]) == ("fake-model", "model", 128)


async def test_metrics_after_requests(client: httpx.AsyncClient) -> None:
    assert (await client.post("/v1/completions", json=GOOD)).status_code == 200
    assert (await client.post("/v1/completions", json=GOOD | {"max_tokens": -1})).status_code == 400
    assert (await client.get("/no/such/path")).status_code == 404
    r = await client.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    for line in [
        'blitzscale_requests_total{endpoint="/v1/completions",status="200"} 1.0',
        'blitzscale_requests_total{endpoint="/v1/completions",status="400"} 1.0',
        'blitzscale_requests_total{endpoint="unmatched",status="404"} 1.0',
        "blitzscale_ttft_seconds_count 1.0",
        "blitzscale_tbt_seconds_count 1.0",  # two tokens: one gap
    ]:
        assert line in text, line
    assert 'blitzscale_ttft_seconds_bucket{le="0.005"}' in text
    assert 'blitzscale_tbt_seconds_bucket{le="0.001"}' in text


async def test_metrics_share_the_routers_registry(fake: FakeBackend) -> None:
    registry = CollectorRegistry()
    instances = Gauge("blitzscale_instances", "router metric", registry=registry)
    instances.set(3)
    async with client_for(create_app(fake, registry=registry)) as client:
        await client.post("/v1/completions", json=GOOD)
        text = (await client.get("/metrics")).text
    assert "blitzscale_instances 3.0" in text and "blitzscale_ttft_seconds_count 1.0" in text


async def test_apps_have_their_own_registries_unless_they_share_metrics(fake: FakeBackend) -> None:
    shared = ApiMetrics(CollectorRegistry())
    apps = [
        create_app(fake),
        create_app(fake),
        create_app(fake, metrics=shared),
        create_app(fake, metrics=shared),
    ]
    for app in apps:
        async with client_for(app) as client:
            await client.post("/v1/completions", json=GOOD)
    assert shared.requests_total.labels(endpoint="/v1/completions", status="200")._value.get() == 2
    async with client_for(apps[0]) as client:
        assert "blitzscale_ttft_seconds_count 1.0" in (await client.get("/metrics")).text


async def test_reset_prefix_cache_needs_the_key_and_tells_the_backend(fake: FakeBackend) -> None:
    async with client_for(create_app(fake, api_key=KEY)) as client:
        assert_error(await client.post("/reset_prefix_cache"), 401, says="API key")
        assert fake.resets == 0
        r = await client.post("/reset_prefix_cache", headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 200 and r.json() == {"status": "ok", "instances": 1}
        assert fake.resets == 1
