"""What one GPU can check of the serving cluster: a CUDA worker joins the world through the
controller's store (bound to the configured host, as is everything that listens), serves
tokens equal to a local engine's, and a failing request leaves it serving."""

from __future__ import annotations

import asyncio
import os

import pytest
import torch

from blitzscale.engine import SamplingParams
from blitzscale.serve.background import LoopThread
from blitzscale.serve.config import ServeConfig
from blitzscale.serve.server import ServingCluster
from tests.gpu.reference import local_tokens
from tests.listeners import LOOPBACK, listening

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
MODEL = "random:tiny-llama3"


def test_one_cuda_worker_serves_exact_tokens_and_listens_on_loopback_only(tmp_path) -> None:
    cfg = ServeConfig().with_overrides(
        model={"name": MODEL, "cache_dir": str(tmp_path)},
        cluster={"num_workers": 1, "device": "cuda"},
        router={"mode": "colocated"},
        policy={"name": "fixed", "fixed_prefill": 1},
    )
    prompts = [list(range(3 + i, 40 + 7 * i)) for i in range(4)]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    ref = local_tokens(MODEL, tmp_path, prompts, params)
    lt = LoopThread()
    service = ServingCluster(cfg)
    try:
        lt.run(service.start())
        router, cluster = service.router, service.cluster
        assert router is not None and cluster is not None

        async def one(i: int, p: SamplingParams) -> list[int]:
            out: list[int] = []
            async for o in router.generate(f"r{i}", prompts[i % len(prompts)], p):
                out += o.new_token_ids
            return out

        async def all_of_them() -> list[list[int]]:
            return list(await asyncio.gather(*[one(i, params) for i in range(len(prompts))]))

        assert lt.run(all_of_them()) == ref
        tiny = SamplingParams(max_tokens=24, temperature=1e-30, ignore_eos=True)  # greedy, not a crash
        assert lt.run(one(10, tiny)) == ref[2]
        addrs = listening([os.getpid(), *(p.pid for p in cluster.procs)])
        assert addrs and all(a.split(":")[0] == LOOPBACK for a in addrs), addrs
        assert cluster.alive_ranks() == [0]
    finally:
        lt.run(service.stop())
        lt.close()
