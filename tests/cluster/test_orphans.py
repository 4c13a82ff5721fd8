"""A controller killed outright (SIGKILL: no shutdown message, no cleanup) leaves no worker
behind: the workers, forked by multiprocessing's forkserver, see their parent go once the
forkserver has seen the controller go."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.procs import descendants

CONTROLLER = """
import time
from blitzscale.cluster.config import ClusterConfig
from blitzscale.cluster.local import LocalCluster

if __name__ == "__main__":
    cluster = LocalCluster(ClusterConfig(num_workers=2)).start()
    print(*(p.pid for p in cluster.procs), flush=True)
    time.sleep(600)
"""


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_workers_of_a_killed_controller_leave(tmp_path: Path) -> None:
    script = tmp_path / "controller.py"
    script.write_text(CONTROLLER)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    family: set[int] = set()
    try:
        assert proc.stdout is not None
        workers = {int(p) for p in proc.stdout.readline().split()}
        family = descendants(proc.pid)
        assert len(workers) == 2 and workers <= family, (workers, family)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 60
        left = family
        while left and time.monotonic() < deadline:
            left = {p for p in left if _running(p)}
            time.sleep(0.2)
        assert not left, f"still running after the controller was killed: {sorted(left)}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in family:  # (only if the test failed)
            if _running(p):
                os.kill(p, signal.SIGKILL)
