"""Tensor-parallel shards of a transfer, and the per-receiver report of one."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from blitzscale.cluster.results import TransferResult
from blitzscale.messages import TransferRankResult
from blitzscale.transfer.plan import chains_for


@dataclass(frozen=True)
class ShardPlan:
    sources: list[int]
    targets: list[int]
    tp_rank: int

    def chains(self) -> list[list[int]]:
        """A host-source head that is also a target loads itself and heads the chain."""
        chain_targets = [t for t in self.targets if t not in self.sources]
        return chains_for(self.sources, chain_targets) if chain_targets else [[self.sources[0]]]


def neighbour_pairs(chains: list[list[int]]) -> list[tuple[int, int]]:
    """The links a transfer along `chains` uses (each pair once, lower rank first)."""
    return sorted({(min(a, b), max(a, b)) for c in chains for a, b in itertools.pairwise(c)})


def transfer_report(
    results: dict[int, TransferRankResult],
    receivers: list[int],
    chains_of: dict[int, list[list[int]]],
    replied_at: float,
) -> dict[int, TransferResult]:
    """Per receiver (`TransferResult`): seconds to completion and to the first layer,
    counted from the moment it and every rank upstream of it in its chains had its buffers
    ready (so one slow allocation elsewhere is not charged to the link). `results`: every
    participant's reply; `replied_at`: when the controller had them all (wall clock)."""
    t_first = min(res.start for res in results.values())
    heads = [r for r in results if r not in receivers]
    senders_done = max((results[h].done_at - t_first for h in heads), default=0.0)
    out = {}
    for r in receivers:
        upstream = {r} | {c[k] for c in chains_of[r] if r in c for k in range(c.index(r))}
        t0 = max(results[u].start for u in upstream)
        res = results[r]
        out[r] = TransferResult(
            seconds=res.done_at - t0,
            first_layer_s=(res.first_layer_at or res.done_at) - t0,
            bytes=res.bytes_received,
            alloc_s=res.start - res.received_at,
            ready_order=tuple(res.ready_order),
            senders_done_s=senders_done,
            replied_s=replied_at - t_first,
            sources=tuple(sorted({c[0] for c in chains_of[r] if r in c})),
        )
    return out
