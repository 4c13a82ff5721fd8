"""How many models one rank holds at once (`[cluster] models_per_rank`, 0: derived here).

A pure function of the models' sizes and the device, used by `serve` once its workers have
said their device's memory and each model's shape, and by the simulator from its preset's
profile. Each resident model's engine takes an equal share of the device (utilization x
memory / S) and must fit in it its weights and the KV cache of one request of its whole
context (what `serve/costs.py check_fits_device` asks of a share), so S is the most of the
largest such footprint that fit, never more than the models served (a slot nobody can use
would only shrink the others' KV caches) and never less than one.

On a CPU the rule gives one: a CPU worker's memory is its host's, shared with the other
workers there and with the host copies, so it has no device budget to divide; several
models on a CPU worker are asked for explicitly. A tensor-parallel rank serves one model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Footprint:
    """One model's least bytes on one rank: its weights (this rank's shard) and the KV
    cache of one request of its whole context."""

    weight_bytes: int
    min_kv_bytes: int

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.min_kv_bytes


def derive_models_per_rank(
    footprints: Sequence[Footprint], device_memory_bytes: int, utilization: float, gpu: bool, tp: int = 1
) -> int:
    """The number of models a rank holds at once (see the module's text); 1 when the
    device's memory is unknown (0)."""
    if not gpu or tp > 1 or len(footprints) <= 1 or device_memory_bytes <= 0:
        return 1
    need = max(f.bytes for f in footprints)
    return max(1, min(len(footprints), int(device_memory_bytes * utilization) // max(1, need)))


def resolve_models_per_rank(
    asked: int,
    footprints: Sequence[Footprint],
    device_memory_bytes: int,
    utilization: float,
    gpu: bool,
    tp: int = 1,
) -> int:
    """`asked` when set (> 0), else derived."""
    if asked > 0:
        return asked
    return derive_models_per_rank(footprints, device_memory_bytes, utilization, gpu, tp)
