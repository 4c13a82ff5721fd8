"""Without Ray installed the ray backend is refused with the install command, and the
local backend never imports it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from blitzscale.errors import BlitzScaleError, InvalidRequestError
from blitzscale.serve.config import ServeConfig


def test_serve_checks_name_the_extra_when_ray_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from blitzscale.serve import checks

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    cfg = ServeConfig().with_overrides(cluster={"backend": "ray"})
    with pytest.raises(InvalidRequestError, match=r"pip install 'blitzscale\[ray\]'"):
        checks.check_serve_config(cfg)
    checks.check_serve_config(ServeConfig())  # the local backend does not care


def test_the_ray_spawner_names_the_extra_when_ray_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from blitzscale.cluster.ray_spawner import RaySpawner

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(BlitzScaleError, match=r"pip install 'blitzscale\[ray\]'"):
        RaySpawner()


def test_the_local_backend_never_imports_ray() -> None:
    code = (
        "import sys\n"
        "from blitzscale.cluster.local import LocalCluster\n"
        "from blitzscale.serve.server import ServingCluster\n"
        "from blitzscale.cli.main import main\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
