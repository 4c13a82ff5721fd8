"""The replay client reads instance counts and scale events from a BlitzScale /metrics."""

from __future__ import annotations

import httpx
import pytest

from blitzscale.client.server_watch import ServerWatch

PAGE = """# TYPE blitzscale_instances gauge
blitzscale_instances{{role="colocated",state="colocated"}} {n}
blitzscale_instances{{role="none",state="inactive"}} {idle}
blitzscale_instances{{role="none",state="loading"}} 0.0
# TYPE blitzscale_scale_events counter
blitzscale_scale_events_total{{direction="up",path="network"}} {ups}
blitzscale_scale_events_total{{direction="down",path="release"}} 0.0
"""


def test_samples_and_scale_events_from_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    pages = iter([PAGE.format(n=1, idle=2, ups=0), PAGE.format(n=3, idle=0, ups=2)])

    def fake_get(url: str, **_: object) -> httpx.Response:
        assert url == "http://x/metrics"
        return httpx.Response(200, text=next(pages))

    monkeypatch.setattr(httpx, "get", fake_get)
    w = ServerWatch("http://x/")
    w._poll()
    w._poll()
    assert [n for _, n in w.samples] == [1, 3]
    assert [(e["direction"], e["path"]) for e in w.events] == [("up", "network")] * 2


def test_other_servers_yield_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httpx, "get", lambda *a, **k: httpx.Response(404, text="not found"))
    w = ServerWatch("http://x")
    w._poll()
    assert w.samples == [] and w.events == []
