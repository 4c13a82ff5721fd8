"""Fixtures of the client tests."""

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest

from .fake_server import Behaviour, FakeServer, run_fake_server


@pytest.fixture
def fake_server() -> Callable[..., AbstractContextManager[FakeServer]]:
    """`with fake_server(ttft_s=1.0) as server:` starts a server with that behaviour."""

    def start(**kwargs: Any) -> AbstractContextManager[FakeServer]:
        return run_fake_server(Behaviour(**kwargs))

    return start
