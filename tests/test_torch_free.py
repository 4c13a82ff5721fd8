"""The control plane never loads torch: the messages, the plain data they carry (core/),
every module of the control policies and of the simulator (and the engine's bookkeeping and
the worker's dispatcher it runs), the router and the scaler import
in a fresh interpreter with no `torch` in `sys.modules` afterwards. Each group is imported
in its own subprocess, so what another group (or this test run) imported cannot hide a
torch import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import blitzscale

ROOT = Path(blitzscale.__file__).parent


def _modules(package: str) -> list[str]:
    """Every module of a subpackage of blitzscale, the package itself first."""
    folder = ROOT / package
    names = [f"blitzscale.{package}"]
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] != "__init__":
            names.append(".".join(parts))
    return names


GROUPS = {
    "messages": ["blitzscale.messages", *_modules("core")],
    "control": _modules("control"),
    "router and scaler": ["blitzscale.serve.router", "blitzscale.serve.scaler"],
    "simulator": _modules("sim"),
    # what the simulator runs of the engine and the worker (sim/engine.py)
    "engine bookkeeping": [
        "blitzscale.engine",
        "blitzscale.engine.request",
        "blitzscale.engine.table",
        "blitzscale.engine.scheduler",
        "blitzscale.engine.output",
        "blitzscale.engine.work",
        "blitzscale.engine.handoff_book",
        "blitzscale.engine.live_order",
        "blitzscale.kvcache",
        "blitzscale.kvcache.pool",
        "blitzscale.worker.dispatch",
        "blitzscale.worker.pacing",
    ],
}


@pytest.mark.parametrize("group", list(GROUPS))
def test_importing_the_control_plane_does_not_load_torch(group: str) -> None:
    modules = GROUPS[group]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "    if 'torch' in sys.modules:\n"
        "        print(name)\n"
        "        break\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    culprit = out.stdout.strip()
    assert not culprit, f"importing {culprit} (of the {group}) loaded torch"
