"""Start-up steps say what they are doing (core/progress.py): piped, a line once a step
has lasted a second and then every few seconds, and its duration at the end; a quick step
says nothing; on a terminal a spinner instead of the repeated lines."""

from __future__ import annotations

import io
import itertools
import logging
import threading
from pathlib import Path

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


def test_a_step_that_reports_bytes_shows_them_piped_and_as_a_bar_on_a_terminal() -> None:
    from blitzscale.core.progress import how_far

    logger, h = _logger()
    with Phase("preparing the model", every_s=0.05, stream=io.StringIO(), logger=logger) as p:
        p.report("writing", 4_000_000_000, 16_000_000_000)
        assert h.wait_for(3)
    assert any(line.endswith("s so far; writing 4.0 of 16.0 GB (25%))") for line in h.lines[1:-1])
    assert how_far("writing", 4, 16, bar=True) == "writing [######------------------] 0.0 of 0.0 GB (25%)"


def test_a_conversion_reports_its_checksums_and_writes_to_the_last_byte(tmp_path: Path) -> None:
    from blitzscale.checkpoint.convert import convert
    from blitzscale.checkpoint.native import rank_file, read_header

    heard: list[tuple[str, int, int]] = []
    dst = convert("random:tiny-llama3", tmp_path / "m", tp_size=2, report=lambda *a: heard.append(a))
    for rank in (1, 2):
        for stage in ("checksums", "writing"):
            name = f"rank {rank} of 2: {stage}"
            seen = [(done, total) for s, done, total in heard if s == name]
            assert seen and all(a[0] <= b[0] for a, b in itertools.pairwise(seen))
            assert seen[-1][0] == seen[-1][1] > 0  # to the last byte
    assert read_header(rank_file(dst, 1))["dtype"]  # (the files are whole)
