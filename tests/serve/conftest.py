"""A serving cluster of CPU workers with the real SmolLM2, run on its own event loop thread
so synchronous tests (and the openai client) can drive it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from blitzscale.serve.config import ServeConfig
from blitzscale.serve.server import ServingCluster

T = TypeVar("T")


class LoopThread:
    """An asyncio loop in a daemon thread; `run(coro)` waits for the result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 300) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def make_service(**sections: dict[str, Any]) -> Callable[[], Iterator[tuple[ServingCluster, LoopThread]]]:
    def fixture() -> Iterator[tuple[ServingCluster, LoopThread]]:
        cfg = ServeConfig().with_overrides(**sections)
        lt = LoopThread()
        service = ServingCluster(cfg)
        try:
            lt.run(service.start())
            yield service, lt
        finally:
            lt.run(service.stop())
            lt.close()

    return fixture


FAST_PLANNER = {"scale_down_idle_s": 0.3, "shutting_null_keep_s": 0.3, "tokens_prefilled_per_sec": 2000.0}

pd_service = pytest.fixture(scope="module")(
    make_service(cluster={"num_workers": 4}, router={"mode": "pd"}, planner=FAST_PLANNER)
)
