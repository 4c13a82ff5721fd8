"""A cluster for code that is not async (scripts, benchmarks, tests)."""

from __future__ import annotations

import asyncio
import functools
import inspect
from typing import Any, Protocol


class Startable(Protocol):
    """What Blocking needs of the cluster it wraps, besides its async operations."""

    def start(self) -> object: ...

    def stop(self) -> None: ...


class Blocking:
    """A cluster (`LocalCluster.blocking`) whose async operations block instead; any other
    attribute is the cluster's own."""

    def __init__(self, cluster: Startable) -> None:
        self._cluster = cluster

    def __enter__(self) -> Blocking:
        self._cluster.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._cluster.stop()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._cluster, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        @functools.wraps(attr)
        def run(*args: Any, **kw: Any) -> Any:
            return asyncio.run(attr(*args, **kw))

        return run
