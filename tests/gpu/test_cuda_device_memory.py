"""A GPU worker's device memory, accounted (worker/memory.py), with random Llama-3-8B weights
(16.06 GB in bf16): under `[cluster] worker_memory_bytes` = 24 GB the first model's engine
takes the room left beside its weights for its KV cache, a second model's load is refused
before anything is allocated (`no_room`, naming the holders: the scaler waits), and once
the first is released the second loads and serves. What is in use is measured on the
device, so the CUDA context and NCCL's buffers count. Run with `make test-gpu`."""

from __future__ import annotations

import pytest
import torch

from blitzscale.cluster.calls import ClusterOpError
from blitzscale.cluster.commands import Activation
from blitzscale.cluster.config import ClusterConfig
from blitzscale.cluster.local import LocalCluster
from blitzscale.core.config import EngineConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SRC = "random:llama3-8b"
CAP = 24_000_000_000
ENGINE = EngineConfig(max_model_len=4096)
KV_PER_TOKEN = 32 * 2 * 8 * 128 * 2  # layers x (K, V) x kv heads x head dim x bf16


def _act(model: str) -> dict[int, Activation]:
    return {0: Activation(model=model, source=SRC, role="colocated", engine=ENGINE)}


def test_a_second_8b_model_waits_for_the_memory_the_first_gives_back() -> None:
    with LocalCluster(ClusterConfig(num_workers=1, device="cuda", worker_memory_bytes=CAP)) as c:
        b = c.blocking
        b.load("a", 0, SRC)
        blocks = b.activate(_act("a"))[0].num_kv_blocks
        kv = blocks * ENGINE.block_size * KV_PER_TOKEN
        assert 4096 * KV_PER_TOKEN <= kv < CAP - 16_000_000_000  # the room left, not 85% of the GPU
        with pytest.raises(ClusterOpError) as e:
            b.load("b", 0, SRC)
        assert e.value.no_room and "the weights of b" in str(e.value) and "weights of a" in str(e.value)
        assert c.pool.gpu_holders("b") == []
        b.deactivate(0)
        b.release("a", 0)
        b.load("b", 0, SRC)
        assert b.activate(_act("b"))[0].num_kv_blocks >= 4096 // ENGINE.block_size
