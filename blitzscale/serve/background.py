"""Running the serving cluster and its HTTP edge on a background event loop, so synchronous
code (the demo, tests, notebooks) can drive it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from blitzscale.serve.config import ServeConfig
from blitzscale.serve.server import ServingCluster, _quiet_server

T = TypeVar("T")


class LoopThread:
    """An asyncio loop in a daemon thread; `run(coro)` waits for the result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="serve-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 600) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


class BackgroundService:
    """`with BackgroundService(cfg) as svc:` a running cluster with HTTP at `svc.url`."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        self.lt = LoopThread()
        self.service = ServingCluster(cfg)
        self.url = ""
        self._server: Any = None

    def __enter__(self) -> BackgroundService:
        try:
            self.lt.run(self.service.start())
            self.url = self.lt.run(self._serve_http())
        except BaseException:
            self.__exit__()
            raise
        return self

    async def _serve_http(self) -> str:
        import uvicorn

        config = uvicorn.Config(self.service.app(), host=self.cfg.server.host, port=0, log_level="warning")
        self._server = _quiet_server(config)
        asyncio.get_running_loop().create_task(self._server.serve())
        while not self._server.started:
            await asyncio.sleep(0.02)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        return f"http://{self.cfg.server.host}:{port}"

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self.lt.run(asyncio.sleep(0.3))
        self.lt.run(self.service.stop())
        self.lt.close()
