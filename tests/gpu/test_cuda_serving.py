"""The serving cluster on two GPUs: prefill on one, decode on the other, KV migrated over
NCCL; tokens equal a local engine's, and a burst scales nothing it should not."""

from __future__ import annotations

import asyncio

import pytest
import torch

from blitzscale.engine import SamplingParams
from blitzscale.serve.background import LoopThread
from blitzscale.serve.config import ServeConfig
from blitzscale.serve.server import ServingCluster
from tests.gpu.reference import local_tokens

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]
MODEL = "random:tiny-llama3"


def test_pd_mode_over_nccl_matches_a_local_engine(tmp_path) -> None:
    cfg = ServeConfig().with_overrides(
        model={"name": MODEL, "cache_dir": str(tmp_path)},
        cluster={"num_workers": 2, "device": "cuda"},
        router={"mode": "pd"},
        policy={"name": "fixed", "fixed_prefill": 1, "fixed_decode": 1},
    )
    prompts = [list(range(3 + i, 40 + 7 * i)) for i in range(4)]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    ref = local_tokens(MODEL, tmp_path, prompts, params)

    lt = LoopThread()
    service = ServingCluster(cfg)
    try:
        lt.run(service.start())

        async def one(i: int) -> list[int]:
            out: list[int] = []
            assert service.router is not None
            async for o in service.router.generate(f"r{i}", prompts[i], params):
                out += o.new_token_ids
            return out

        async def all_of_them() -> list[list[int]]:
            return list(await asyncio.gather(*[one(i) for i in range(len(prompts))]))

        assert lt.run(all_of_them()) == ref
    finally:
        lt.run(service.stop())
        lt.close()
