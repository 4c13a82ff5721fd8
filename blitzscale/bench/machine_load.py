"""How busy this machine is with other work while a benchmark runs (Linux).

A sampler thread reads, every `interval_s`, how many threads the kernel has runnable
(`procs_running` in /proc/stat) and how many of them are ours (state R in
/proc/<pid>/task/*/stat for this process and the pids given, e.g. the CPU workers); the
difference, averaged, is the other work sharing the cores. `blitzscale bench fidelity
--calibrate` gives it to the simulated cores (sim/cores.py), so on a loaded machine the
simulated side slows down as the live one does.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

PROC = Path("/proc")


def runnable_threads() -> int | None:
    """Threads runnable on the whole machine now (None: not Linux)."""
    try:
        for line in (PROC / "stat").read_text().splitlines():
            if line.startswith("procs_running "):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def our_runnable_threads(pids: list[int]) -> int:
    """Threads of `pids` in state R (running or runnable) now."""
    n = 0
    for pid in pids:
        try:
            tasks = list((PROC / str(pid) / "task").iterdir())
        except OSError:
            continue  # gone
        for task in tasks:
            try:
                stat = (task / "stat").read_text()
            except OSError:
                continue
            if stat[stat.rindex(")") + 2 :].startswith("R"):  # (the name may hold spaces)
                n += 1
    return n


class OtherWork:
    """`with OtherWork(lambda: worker_pids) as w: ...; w.threads`: the mean number of
    runnable threads that are not ours, over the block."""

    def __init__(self, pids: Callable[[], list[int]], interval_s: float = 0.25) -> None:
        self._pids = pids
        self._interval = interval_s
        self._stop = threading.Event()
        self._samples: list[int] = []
        self._thread = threading.Thread(target=self._run, name="other-work", daemon=True)

    def __enter__(self) -> OtherWork:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            total = runnable_threads()
            if total is None:
                return
            ours = our_runnable_threads([os.getpid(), *self._pids()])
            self._samples.append(max(0, total - ours))

    @property
    def threads(self) -> float:
        return sum(self._samples) / len(self._samples) if self._samples else 0.0
