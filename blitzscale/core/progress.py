"""Saying what a long start-up step is doing while it does it.

`serve` on a GPU with a random 8B model used to be silent for about 100 s (writing the
weights, starting the workers: standby engines, kernels, CUDA graphs; measuring the cost
model; the first loads). Each such step runs inside a `Phase`: on a terminal a spinner with
the seconds so far; when the output is piped or logged, a line once the step has lasted a
second and one every `every_s` seconds after; either way a line with its duration at the
end when it took longer than a second (a quick step says nothing). A step that knows how
far it is (`Phase.report`: bytes of a stage, e.g. the weights written) shows a bar on a
terminal and the bytes in its lines.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

log = logging.getLogger("blitzscale.serve")
HEARTBEAT_S = 5.0  # piped output: a line this often while a step lasts
QUIET_S = 1.0  # steps shorter than this say nothing at their end
BAR = 24  # characters of the terminal's bar

# (stage, bytes done, bytes in all): how a long piece of work says how far it is
Report = Callable[[str, int, int], None]


def how_far(stage: str, done: int, total: int, bar: bool = False) -> str:
    """'writing 3.2 of 16.1 GB (20%)', with a text bar before the figures if `bar`."""
    share = min(1.0, done / total) if total > 0 else 0.0
    figures = f"{done / 1e9:.1f} of {total / 1e9:.1f} GB ({share:.0%})"
    if not bar:
        return f"{stage} {figures}"
    full = int(share * BAR)
    return f"{stage} [{'#' * full}{'-' * (BAR - full)}] {figures}"


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
        self._far: tuple[str, int, int] | None = None  # the last `report`

    def report(self, stage: str, done: int, total: int) -> None:
        """How far the step is: `done` of `total` bytes of `stage` (from any thread; shown
        by the next tick or line)."""
        self._far = (stage, done, total)

    def _how_far(self, bar: bool) -> str:
        far = self._far
        return "" if far is None else how_far(*far, bar=bar)

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
            far = self._how_far(bar=False)
            self.log.info("%s ... (%.0f s so far%s)", self.what, self.seconds, f"; {far}" if far else "")

    def _tick(self, status: object) -> None:
        while not self._done.wait(0.5):
            far = self._how_far(bar=True)
            status.update(f"{self.what} ... {far + ', ' if far else ''}{self.seconds:.0f} s")  # type: ignore[attr-defined]

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
