"""Tensor-parallel shards of a transfer, and the per-receiver report of one."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from blitzscale.messages import ReplyMsg
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
    replies: dict[int, ReplyMsg], receivers: list[int], chains_of: dict[int, list[list[int]]]
) -> dict[int, dict[str, Any]]:
    """Per receiver: seconds to completion and to the first layer, counted from the moment
    it and every rank upstream of it in its chains had its buffers ready (so one slow
    allocation elsewhere is not charged to the link). `alloc_s` is its own preparation."""
    out = {}
    for r in receivers:
        upstream = {r} | {c[k] for c in chains_of[r] if r in c for k in range(c.index(r))}
        t0 = max(replies[u].result["start"] for u in upstream)
        res = replies[r].result
        seconds = res["done_at"] - t0
        out[r] = {
            "seconds": seconds,
            "first_layer_s": (res["first_layer_at"] or res["done_at"]) - t0,
            "alloc_s": res["start"] - res["received_at"],
            "ready_order": res["ready_order"],
            "bytes": res["bytes_received"],
            "GBps": res["bytes_received"] / seconds / 1e9 if seconds > 0 else float("inf"),
        }
    return out
