"""Saying what a long start-up step is doing while it does it.

`serve` on a GPU with a random 8B model used to be silent for about 100 s (writing the
weights, starting the workers: standby engines, kernels, CUDA graphs; measuring the cost
model; the first loads). Each such step runs inside a `Phase`: on a terminal a spinner with
the seconds so far; when the output is piped or logged, a line once the step has lasted a
second and one every `every_s` seconds after; either way a line with its duration at the
end when it took longer than a second (a quick step says nothing).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from types import TracebackType
from typing import TextIO

log = logging.getLogger("blitzscale.serve")
HEARTBEAT_S = 5.0  # piped output: a line this often while a step lasts
QUIET_S = 1.0  # steps shorter than this say nothing at their end


class Phase:
    """`with Phase("starting 4 workers"):` around one step of a start-up."""

    def __init__(
        self,
        what: str,
        every_s: float = HEARTBEAT_S,
        stream: TextIO | None = None,
        logger: logging.Logger = log,
    ) -> None:
        self.what = what
        self.every_s = every_s
        self.stream = stream if stream is not None else sys.stderr
        self.log = logger
        self.started = 0.0
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._status: object | None = None

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def __enter__(self) -> Phase:
        self.started = time.monotonic()
        if self.stream.isatty():
            from rich.console import Console

            status = Console(file=self.stream).status(self.what + " ...")
            status.start()
            self._status = status
            self._thread = threading.Thread(target=self._tick, args=(status,), daemon=True, name="progress")
        else:
            self._thread = threading.Thread(target=self._beat, daemon=True, name="progress")
        self._thread.start()
        return self

    def _beat(self) -> None:
        if self._done.wait(QUIET_S):
            return
        self.log.info("%s ...", self.what)
        while not self._done.wait(self.every_s):
            self.log.info("%s ... (%.0f s so far)", self.what, self.seconds)

    def _tick(self, status: object) -> None:
        while not self._done.wait(0.5):
            status.update(f"{self.what} ... {self.seconds:.0f} s")  # type: ignore[attr-defined]

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        if self._status is not None:
            self._status.stop()  # type: ignore[attr-defined]
        took = self.seconds
        if exc is None and took >= QUIET_S:
            self.log.info("%s: done in %.1f s", self.what, took)
