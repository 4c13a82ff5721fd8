"""bench/machine_load.py: the other work on this machine, from /proc (Linux)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from blitzscale.bench.machine_load import free_cores, runnable_threads

pytestmark = pytest.mark.skipif(runnable_threads() is None, reason="no /proc/stat")


def test_a_spinning_process_is_other_work_and_free_cores_never_drop_below_one() -> None:
    cores = os.cpu_count() or 1
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = free_cores(sample_s=1.5, cores=cores)
    finally:
        spin.kill()
        spin.wait()
    assert 1.0 <= busy <= max(1.0, cores - 0.5)  # (the spinner is runnable at every sample)
    assert free_cores(sample_s=0.5, cores=1) == 1.0
