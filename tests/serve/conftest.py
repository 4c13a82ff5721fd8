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

# One PD cluster shared by the modules of the `pd_service` xdist unit (test_dashboard,
# test_http, test_sampling_paths, then test_scaling, which scales it up and back down):
# started by the first test that asks for it, stopped once the unit's last test is done,
# not at the end of the session (an idle cluster's five processes take CPU from the tests still running).
PD_CONFIG = {"cluster": {"num_workers": 4}, "router": {"mode": "pd"}, "planner": FAST_PLANNER}
_pd_stack = contextlib.ExitStack()
_pd: dict[str, Any] = {}


@pytest.fixture(scope="module")
def pd_service() -> tuple[ServingCluster, LoopThread]:
    if "service" not in _pd:
        _pd["service"] = _pd_stack.enter_context(running(ServeConfig().with_overrides(**PD_CONFIG)))
    return _pd["service"]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    result = yield  # (the module's own fixtures, which may use the service, end first)
    if _pd and _last_of_unit(item):
        _pd.clear()
        _pd_stack.close()
    return result


def _last_of_unit(item: pytest.Item) -> bool:
    from tests.conftest import work_unit

    unit = work_unit(item.nodeid)
    if unit != "pd_service":
        return False
    items = item.session.items
    later = items[items.index(item) + 1 :]
    return not any(work_unit(i.nodeid) == unit for i in later)


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


@pytest.fixture(scope="module")
def pd_url(pd_service: tuple[ServingCluster, LoopThread]) -> str:
    """`pd_service` over HTTP (one app per service: its metrics live in the service's
    registry), stopped before the service."""
    if "url" not in _pd:
        url, server = start_http(*pd_service)
        _pd_stack.callback(stop_http, server, pd_service[1])
        _pd["url"] = url
    return _pd["url"]
