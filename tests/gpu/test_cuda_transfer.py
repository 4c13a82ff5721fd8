"""Weight transfers between GPUs over NCCL (needs 2 GPUs): bit-identical, pool updated."""

from __future__ import annotations

import pytest
import torch

from blitzscale.cluster.config import ClusterConfig
from blitzscale.cluster.local import LocalCluster

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]
MODEL = "random:tiny-llama3"


def test_p2p_and_host_paths_are_bit_identical_over_nccl() -> None:
    with LocalCluster(ClusterConfig(num_workers=2, device="cuda", transfer_timeout_s=20)).blocking as c:
        c.load("m", 0, MODEL)
        ref = c.checksum("m", 0)
        report = c.transfer("m", MODEL, [0], [1], piece_bytes=1 << 16)
        assert report[1].bytes > 0
        assert c.checksum("m", 1) == ref
        assert c.pool.gpu_holders("m") == [0, 1]
        c.cache_on_host("m", 0)
        c.release("m", 0)
        c.release("m", 1)
        assert c.pool.gpu_holders("m") == []
        c.transfer("m", MODEL, [0], [0, 1], from_host=True)
        assert c.checksum("m", 0) == ref
        assert c.checksum("m", 1) == ref
        c.release("m", 1)
        c.transfer("m", MODEL, [0], [1], from_host=True)  # host owner busy: staged through its GPU
        assert c.checksum("m", 1) == ref
