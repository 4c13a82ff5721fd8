"""A router request's stage changes only by the moves its stage allows (serve/requests.py)."""

from __future__ import annotations

import pytest

from blitzscale.core.sampling import SamplingParams
from blitzscale.serve.requests import STAGE_MOVES, RequestStageError, RouterRequest, Stage


def _req() -> RouterRequest:
    return RouterRequest("r1", [1, 2, 3], SamplingParams(max_tokens=2))


def test_the_pd_path_and_a_rerun_are_allowed() -> None:
    r = _req()
    path = (Stage.PREFILL, Stage.QUEUED, Stage.PREFILL, Stage.MIGRATING, Stage.DECODE, Stage.QUEUED)
    for s in (*path, Stage.PREFILL, Stage.DONE):  # (decode -> queued: a rerun, nothing streamed)
        r.move(s)
    assert r.stage is Stage.DONE
    r.move(Stage.DONE)  # finishing twice is harmless


@pytest.mark.parametrize(
    ("path", "bad"),
    [
        ((), Stage.DECODE),  # a queued request never decodes without a prefill
        ((Stage.PREFILL, Stage.MIGRATING), Stage.QUEUED),  # its KV is moving: no rerun
        ((Stage.PREFILL, Stage.DONE), Stage.PREFILL),  # done is final
        ((Stage.PREFILL,), Stage.ABORTING),  # only a moving KV hand-off is aborted so
    ],
)
def test_a_move_the_stage_does_not_allow_is_refused(path: tuple[Stage, ...], bad: Stage) -> None:
    r = _req()
    for s in path:
        r.move(s)
    before = r.stage
    with pytest.raises(RequestStageError, match=f"{before.value} -> {bad.value}"):
        r.move(bad)
    assert r.stage is before


def test_every_stage_but_done_can_end() -> None:
    assert all(Stage.DONE in moves for s, moves in STAGE_MOVES.items() if s is not Stage.DONE)
    assert set(STAGE_MOVES) == set(Stage)
