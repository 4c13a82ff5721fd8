"""Watching a BlitzScale server's /metrics during a replay: how many instances served, and
when it scaled. Another server (no such metrics) simply yields nothing."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

POLL_S = 0.5


class ServerWatch:
    """Polls in a thread from `start()` to `stop()`; times are seconds since `start()`."""

    def __init__(self, url: str, api_key: str | None = None) -> None:
        self.url = url.rstrip("/") + "/metrics"
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.samples: list[tuple[float, int]] = []
        self.events: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="server-watch", daemon=True)
        self._t0 = 0.0
        self._counts: dict[tuple[str, str], float] | None = None

    def start(self) -> ServerWatch:
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._poll()  # the state at the end of the run

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self._poll()

    def _poll(self) -> None:
        try:
            text = httpx.get(self.url, headers=self.headers, timeout=2).text
            families = list(text_string_to_metric_families(text))
        except (httpx.HTTPError, ValueError):
            return
        now = time.perf_counter() - self._t0
        serving, counts, seen = 0, {}, False
        for fam in families:
            for s in fam.samples:
                if s.name == "blitzscale_instances":
                    seen = True
                    if s.labels.get("role", "none") != "none":
                        serving += int(s.value)
                elif s.name == "blitzscale_scale_events_total":
                    counts[(s.labels["direction"], s.labels["path"])] = s.value
        if not seen:
            return
        self.samples.append((now, serving))
        if self._counts is not None:
            for key, value in counts.items():
                for _ in range(int(value - self._counts.get(key, 0.0))):
                    self.events.append({"time": now, "direction": key[0], "path": key[1]})
        self._counts = counts
