"""Run an ASGI app under a real uvicorn server on 127.0.0.1 (port chosen by the OS) in a thread.

For what the in-process transport cannot show: the official `openai` client over real HTTP,
and clients that really close their connection mid-request.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


@contextmanager
def live_server(app: Any) -> Iterator[str]:
    """Yields the server's base URL (`http://127.0.0.1:PORT`); stops the server on exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.01)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=5)
        sock.close()


def wait_until(predicate: Any, timeout_s: float = 3.0) -> bool:
    """Poll `predicate()` until it is true or `timeout_s` passed; returns its last value."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return bool(predicate())
        time.sleep(0.01)
    return True
