"""Start-up steps say what they are doing (core/progress.py): piped, a line once a step
has lasted a second and then every few seconds, and its duration at the end; a quick step
says nothing; on a terminal a spinner instead of the repeated lines."""

from __future__ import annotations

import io
import logging
import threading

from blitzscale.core.progress import Phase


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.more = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self.more:
            self.lines.append(record.getMessage())
            self.more.notify_all()

    def wait_for(self, n: int) -> bool:
        with self.more:
            return self.more.wait_for(lambda: len(self.lines) >= n, timeout=60)


def _logger() -> tuple[logging.Logger, _Lines]:
    logger = logging.getLogger("tests.progress")
    logger.handlers.clear()
    logger.propagate = False
    logger.setLevel(logging.INFO)
    h = _Lines()
    logger.addHandler(h)
    return logger, h


def test_a_long_step_piped_says_it_started_goes_on_and_ended() -> None:
    logger, h = _logger()
    with Phase("writing the weights", every_s=0.05, stream=io.StringIO(), logger=logger):
        assert h.wait_for(3)  # the first after a second, then the heartbeats
    assert h.lines[0] == "writing the weights ..."
    assert "s so far" in h.lines[1]
    assert h.lines[-1].startswith("writing the weights: done in ")


def test_a_quick_step_says_nothing() -> None:
    logger, h = _logger()
    with Phase("reading the cache", every_s=0.05, stream=io.StringIO(), logger=logger):
        pass
    assert h.lines == []


def test_on_a_terminal_a_spinner_and_the_duration_at_the_end() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    logger, h = _logger()
    out = Tty()
    done = threading.Event()
    with Phase("capturing CUDA graphs", stream=out, logger=logger) as p:
        done.wait(1.2)  # (longer than a second: the end is said)
        assert p.seconds >= 1.0
    assert "capturing CUDA graphs" in out.getvalue()  # the spinner's text
    assert len(h.lines) == 1 and h.lines[0].startswith("capturing CUDA graphs: done in ")
