"""Fixtures of the API tests: a fake backend, an app over it, and an in-process client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from blitzscale.api.app import create_app

from .fake_backend import FakeBackend

BASE_URL = "http://127.0.0.1"


def pytest_configure(config: pytest.Config) -> None:
    marker = "real_model: loads the real SmolLM2-135M on CPU (~10 s); part of the normal CPU suite"
    config.addinivalue_line("markers", marker)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def fake() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def app(fake: FakeBackend) -> FastAPI:
    return create_app(fake)


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url=BASE_URL) as c:
        yield c
