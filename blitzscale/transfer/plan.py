"""Pure planning of weight transfers: pieces, chains, and each rank's part.

A model's buffer is cut into pieces in layer order: each segment is split into
`num_stripes` stripes (one per source chain) and each stripe, optionally, into pieces of at
most `piece_bytes`. Chain j carries stripe j: its head sends, every other member receives
from its predecessor and forwards to its successor as soon as a piece has landed.

With several sources the chains visit the targets in rotated order, so each stripe enters
the target set at a different target and the targets pass stripes on to each other: the
inbound load on the sources' links is 1/num_sources of the model, and the targets finish
with what is in effect a ring all-gather over their own links.
"""

from __future__ import annotations

from dataclasses import dataclass

from blitzscale.model.layout import WeightLayout

STRIPE_ALIGN_BYTES = 4096


@dataclass(frozen=True)
class Piece:
    segment: int
    stripe: int
    offset: int  # elements from the start of the buffer
    numel: int


@dataclass(frozen=True)
class RankRole:
    """What one rank does in a transfer: per stripe, whom it receives from and sends to."""

    recv_from: dict[int, int]
    send_to: dict[int, int]

    @property
    def is_target(self) -> bool:
        return bool(self.recv_from)


def chains_for(sources: list[int], targets: list[int]) -> list[list[int]]:
    """One chain per source; chain j starts its walk over the targets at a rotated position."""
    if not sources or not targets:
        raise ValueError("a transfer needs at least one source and one target")
    if set(sources) & set(targets):
        raise ValueError(f"ranks {sorted(set(sources) & set(targets))} are both source and target")
    if len(set(targets)) != len(targets) or len(set(sources)) != len(sources):
        raise ValueError("a rank appears twice in a transfer")
    n, m = len(targets), len(sources)
    chains = []
    for j, s in enumerate(sources):
        shift = (j * n) // m
        chains.append([s, *targets[shift:], *targets[:shift]])
    return chains


def role_of(rank: int, chains: list[list[int]]) -> RankRole:
    recv_from, send_to = {}, {}
    for j, chain in enumerate(chains):
        if rank not in chain:
            continue
        k = chain.index(rank)
        if k > 0:
            recv_from[j] = chain[k - 1]
        if k + 1 < len(chain):
            send_to[j] = chain[k + 1]
    return RankRole(recv_from, send_to)


def make_pieces(layout: WeightLayout, num_stripes: int, piece_bytes: int = 0) -> list[Piece]:
    """Pieces in the order every participant walks them (segment by segment, layer order)."""
    if num_stripes < 1:
        raise ValueError(f"num_stripes must be >= 1, got {num_stripes}")
    align = max(1, STRIPE_ALIGN_BYTES // layout.itemsize)
    max_piece = piece_bytes // layout.itemsize if piece_bytes > 0 else 0
    pieces: list[Piece] = []
    for si, seg in enumerate(layout.segments):
        per_stripe = -(-seg.numel // num_stripes)
        per_stripe = -(-per_stripe // align) * align
        spans = []
        for j in range(num_stripes):
            lo, hi = j * per_stripe, min(seg.numel, (j + 1) * per_stripe)
            spans.append((j, lo, hi))
        step = max_piece or seg.numel
        # chunk k of every stripe before chunk k+1 of any: chains progress together
        num_chunks = max(-(-(hi - lo) // step) for _, lo, hi in spans if hi > lo)
        for k in range(num_chunks):
            for j, lo, hi in spans:
                start = lo + k * step
                if start < hi:
                    pieces.append(Piece(si, j, seg.offset + start, min(step, hi - start)))
    return pieces


def pieces_per_segment(pieces: list[Piece], num_segments: int) -> list[int]:
    counts = [0] * num_segments
    for p in pieces:
        counts[p.segment] += 1
    return counts
