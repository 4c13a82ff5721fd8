"""A worker's device memory, accounted (worker/memory.py): a load that would not fit
`[cluster] worker_memory_bytes` beside what the worker holds is refused before it
allocates, with a `no_room` reply that names the sizes and what holds the memory (the
scaler waits and tries again), and goes through once a release gives the memory back; a
drained engine kept only to become the standby is given up when that makes the room; an
engine's KV cache takes the room there is, and is refused when not even one request of its
context fits. On a CPU worker, with a tiny random model whose sizes the test computes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from blitzscale.checkpoint import load_config, resolve_model
from blitzscale.checkpoint.convert import convert
from blitzscale.cluster.calls import ClusterOpError
from blitzscale.cluster.commands import Activation
from blitzscale.cluster.config import ClusterConfig
from blitzscale.cluster.local import LocalCluster
from blitzscale.core.config import EngineConfig
from blitzscale.kvcache.cache import KVCache
from blitzscale.model.layout import build_layout
from blitzscale.worker.memory import DeviceMemory, Holding, NoRoomError, measure
from tests.cluster.conftest import SRC

BLOCKS = 170  # a KV cache about the size of the weights
ENGINE = EngineConfig(block_size=16, num_kv_blocks=BLOCKS, max_model_len=256)


def test_what_fits_counts_what_may_be_given_up_and_a_refusal_names_the_sizes() -> None:
    mem = DeviceMemory(capacity=10_000_000_000, used=9_000_000_000, holdings=(Holding("weights of a", 8e9),))
    assert mem.free == 1_000_000_000
    assert mem.fits(1_000_000_000) and not mem.fits(1_000_000_001)
    assert mem.fits(3_000_000_000, reclaimable=2_000_000_000)
    with pytest.raises(NoRoomError) as e:
        mem.check(2_500_000_000, "the weights of b", reclaimable=1_000_000_000)
    assert str(e.value) == (
        "no room on the device for the weights of b: needs 2.50 GB, 1.00 GB of 10.00 GB free "
        "(+1.00 GB of standby it may give up); held: weights of a 8.00 GB, other 1.00 GB"
    )
    unbounded = measure(torch.device("cpu"), [Holding("weights of a", 5)])
    assert unbounded.free is None and unbounded.fits(1 << 60) and unbounded.used == 5
    assert measure(torch.device("cpu"), [Holding("weights of a", 5)], cap=7).free == 2


def _act(model: str, folder: str) -> dict[int, Activation]:
    return {0: Activation(model=model, source=folder, role="colocated", engine=ENGINE)}


def _refused(call: object, *args: object) -> str:
    with pytest.raises(ClusterOpError) as e:
        call(*args)  # type: ignore[operator]
    assert e.value.no_room, str(e.value)
    return str(e.value)


def test_a_load_or_an_engine_that_does_not_fit_waits_for_memory_given_back(tmp_path: Path) -> None:
    folder = str(convert(SRC, tmp_path / "tiny"))
    cfg = load_config(resolve_model(folder))
    weights = build_layout(cfg, 4).nbytes
    per_block = KVCache.bytes_per_block(cfg, ENGINE.block_size, torch.float32)
    cap = weights + BLOCKS * per_block + weights // 2  # one model served, and half of another's weights
    with LocalCluster(ClusterConfig(num_workers=1, worker_memory_bytes=cap)) as c:
        b = c.blocking
        b.load("a", 0, folder)
        assert b.activate(_act("a", folder))[0].num_kv_blocks == BLOCKS  # (it fits as asked)
        why = _refused(b.load, "b", 0, folder)  # its weights do not fit beside a's engine
        assert "the weights of b" in why and "weights of a" in why and "KV cache of a (slot 0)" in why
        assert c.pool.gpu_holders("b") == []  # nothing half-loaded

        b.deactivate(0)  # a's drained engine stays, to become the standby: it is given up
        b.load("b", 0, folder)
        # beside a's and b's weights b's engine gets the room there is, not what it asks
        assert b.activate(_act("b", folder))[0].num_kv_blocks == (cap - 2 * weights) // per_block < BLOCKS
        why = _refused(b.load, "c", 0, folder)
        assert "the weights of c" in why and "KV cache of b (slot 0)" in why

        b.release("a", 0)  # the memory comes back: the load that waited goes through
        b.load("c", 0, folder)
        why = _refused(
            b.activate, {0: Activation(model="c", source=folder, role="colocated", engine=ENGINE, slot=1)}
        )
        assert "the KV cache of c's engine (one request of 256 tokens)" in why  # not even that fits
