"""Transfer plans are pure: pieces cover the buffer exactly once, chains are well formed."""

from __future__ import annotations

import itertools

import pytest

from blitzscale.checkpoint.presets import PRESETS
from blitzscale.model.layout import build_layout
from blitzscale.transfer.plan import chains_for, make_pieces, pieces_per_segment, role_of

LAYOUT = build_layout(PRESETS["tiny-llama3"], itemsize=4)


@pytest.mark.parametrize(("stripes", "piece_bytes"), [(1, 0), (1, 65536), (2, 0), (3, 40000), (4, 4096)])
def test_pieces_cover_the_buffer_exactly_once_in_segment_order(stripes: int, piece_bytes: int) -> None:
    pieces = make_pieces(LAYOUT, stripes, piece_bytes)
    covered = sorted((p.offset, p.offset + p.numel) for p in pieces)
    assert covered[0][0] == 0 and covered[-1][1] == LAYOUT.numel
    assert all(a[1] == b[0] for a, b in itertools.pairwise(covered))  # no gap, no overlap
    assert [p.segment for p in pieces] == sorted(p.segment for p in pieces)
    assert {p.stripe for p in pieces} == set(range(stripes))
    counts = pieces_per_segment(pieces, len(LAYOUT.segments))
    assert sum(counts) == len(pieces) and min(counts) >= 1
    if piece_bytes:
        assert max(p.numel for p in pieces) * LAYOUT.itemsize <= max(piece_bytes, 4096)


def test_chain_per_source_visits_every_target_from_a_rotated_start() -> None:
    assert chains_for([0], [1, 2, 3]) == [[0, 1, 2, 3]]
    chains = chains_for([0, 1], [2, 3, 4, 5])
    assert chains == [[0, 2, 3, 4, 5], [1, 4, 5, 2, 3]]
    role = role_of(4, chains)
    assert role.recv_from == {0: 3, 1: 1} and role.send_to == {0: 5, 1: 5}
    assert role_of(0, chains).recv_from == {} and not role_of(0, chains).is_target
    assert role_of(9, chains).recv_from == {} and role_of(9, chains).send_to == {}


@pytest.mark.parametrize(
    ("sources", "targets", "match"),
    [
        ([], [1], "at least one"),
        ([0], [], "at least one"),
        ([0], [0, 1], "both source and target"),
        ([0], [1, 1], "twice"),
    ],
)
def test_bad_plans_are_refused(sources: list[int], targets: list[int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        chains_for(sources, targets)
