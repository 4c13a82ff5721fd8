"""`RaySpawner.connect` starts a local Ray instance again when Ray's own node-startup limit
(30 s, fixed inside Ray) ran out on a loaded machine; a cluster it joins, or any other
error, is not retried. Ray itself is stood in for: the part under test is the retry."""

from __future__ import annotations

from typing import Any

import pytest

from blitzscale.cluster import ray_spawner
from blitzscale.cluster.ray_spawner import LOCAL_STARTS, RaySpawner

TIMED_OUT = "The current node timed out during startup. This could happen because ..."


class SlowRay:
    """`ray`'s init/shutdown: the first `failures` inits raise `error`."""

    def __init__(self, failures: int, error: str = TIMED_OUT) -> None:
        self.failures, self.error = failures, error
        self.inits: list[str] = []
        self.shutdowns = 0
        self.up = False

    def is_initialized(self) -> bool:
        return self.up

    def init(self, address: str, **_: Any) -> None:
        self.inits.append(address)
        if len(self.inits) <= self.failures:
            raise Exception(self.error)
        self.up = True

    def shutdown(self) -> None:
        self.shutdowns += 1
        self.up = False


def spawner(monkeypatch: pytest.MonkeyPatch, fake: SlowRay, address: str = "") -> RaySpawner:
    monkeypatch.setattr(ray_spawner, "import_ray", lambda: fake)
    monkeypatch.setattr(ray_spawner, "_check_reachable", lambda address: None)
    return RaySpawner(address)


def test_a_local_instance_that_timed_out_starting_is_started_again(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = SlowRay(failures=LOCAL_STARTS - 1)
    sp = spawner(monkeypatch, fake)
    assert sp.connect("10.1.2.3") == "10.1.2.3"  # (not loopback: no node lookup)
    assert fake.inits == ["local"] * LOCAL_STARTS and fake.shutdowns == LOCAL_STARTS - 1
    assert fake.up and sp._started_ray


def test_it_gives_up_after_the_last_start(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = SlowRay(failures=LOCAL_STARTS)
    with pytest.raises(Exception, match="timed out during startup"):
        spawner(monkeypatch, fake).connect("10.1.2.3")
    assert len(fake.inits) == LOCAL_STARTS


@pytest.mark.parametrize(
    "address, error", [("10.9.9.9:6379", TIMED_OUT), ("", "some other failure")], ids=["joining", "other"]
)
def test_joining_a_cluster_or_another_error_is_not_retried(
    monkeypatch: pytest.MonkeyPatch, address: str, error: str
) -> None:
    fake = SlowRay(failures=1, error=error)
    with pytest.raises(Exception, match=error[:20]):
        spawner(monkeypatch, fake, address).connect("10.1.2.3")
    assert len(fake.inits) == 1 and fake.shutdowns == 0
