"""A serving cluster of CPU workers with the real SmolLM2, run on its own event loop thread
so synchronous tests (and the openai client) can drive it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from blitzscale.serve.background import LoopThread
from blitzscale.serve.config import ServeConfig
from blitzscale.serve.server import ServingCluster


@contextlib.contextmanager
def running(cfg: ServeConfig) -> Iterator[tuple[ServingCluster, LoopThread]]:
    """`cfg`'s serving cluster, started on a loop thread of its own; stopped on exit."""
    lt = LoopThread()
    service = ServingCluster(cfg)
    try:
        lt.run(service.start())
        yield service, lt
    finally:
        lt.run(service.stop())
        lt.close()


def make_service(**sections: dict[str, Any]) -> Callable[[], Iterator[tuple[ServingCluster, LoopThread]]]:
    def fixture() -> Iterator[tuple[ServingCluster, LoopThread]]:
        with running(ServeConfig().with_overrides(**sections)) as pair:
            yield pair

    return fixture


FAST_PLANNER = {"scale_down_idle_s": 0.3, "shutting_null_keep_s": 0.3, "tokens_prefilled_per_sec": 2000.0}

# One PD cluster for the session, shared by the modules of the `pd_service` xdist group
# (test_http, test_sampling_paths, then test_scaling, which scales it up and back down).
pd_service = pytest.fixture(scope="session")(
    make_service(cluster={"num_workers": 4}, router={"mode": "pd"}, planner=FAST_PLANNER)
)

colocated_service = pytest.fixture(scope="module")(
    make_service(cluster={"num_workers": 1}, router={"mode": "colocated"}, policy={"name": "fixed"})
)


def start_http(service: ServingCluster, lt: LoopThread, api_key: str | None = None) -> tuple[str, Any]:
    """Serve `service` over HTTP on a free loopback port; returns (base url, uvicorn server)."""
    import uvicorn
    from prometheus_client import CollectorRegistry

    from blitzscale.api.app import create_app

    assert service.router is not None
    registry = service.registry if api_key is None else CollectorRegistry()
    app = create_app(service.router, api_key=api_key, registry=registry)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))

    async def start() -> int:
        asyncio.get_running_loop().create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.02)
        return server.servers[0].sockets[0].getsockname()[1]

    port = lt.run(start())
    return f"http://127.0.0.1:{port}", server


def stop_http(server: Any, lt: LoopThread) -> None:
    async def stop() -> None:
        server.should_exit = True
        while server.started and not getattr(server, "_stopped", False):
            await asyncio.sleep(0.02)
            if not server.servers or all(not s.is_serving() for s in server.servers):
                break

    lt.run(stop())


@pytest.fixture(scope="session")
def pd_url(pd_service: tuple[ServingCluster, LoopThread]) -> Iterator[str]:
    """`pd_service` over HTTP (one app per service: its metrics live in the service's registry)."""
    url, server = start_http(*pd_service)
    yield url
    stop_http(server, pd_service[1])
