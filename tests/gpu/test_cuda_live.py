"""Live scaling on two GPUs: the new instance serves while its weights arrive (the transfer
is capped so that it takes seconds), relays move hidden states and KV over NCCL, and the
tokens equal those the fully loaded instance gave before scaling."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from blitzscale.control.policies import LoadAction
from blitzscale.engine import SamplingParams
from blitzscale.serve.background import LoopThread
from blitzscale.serve.config import ServeConfig
from blitzscale.serve.server import ServingCluster

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]


def test_live_scaling_over_nccl_keeps_tokens_and_serves_while_loading(tmp_path) -> None:
    cfg = ServeConfig().with_overrides(
        model={"name": "random:tiny-llama3", "cache_dir": str(tmp_path)},  # 2.8 MB in fp32: ~7 s
        # fp32: bf16 greedy tokens depend on how requests are batched, which live scaling changes
        cluster={"num_workers": 2, "device": "cuda", "dtype": "float32", "transfer_bytes_per_s": 0.4e6},
        router={"mode": "colocated"},
        engine={"num_kv_blocks": 4096},
        policy={"name": "fixed", "fixed_prefill": 1},
    )
    prompts = [[(31 * i + 7 * j) % 500 + 3 for j in range(64 + 8 * i)] for i in range(24)]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    lt = LoopThread()
    service = ServingCluster(cfg)
    try:
        lt.run(service.start())
        router, scaler = service.router, service.scaler
        assert router is not None and scaler is not None
        first: dict[str, float] = {}

        async def one(rid: str, ids: list[int]) -> list[int]:
            out: list[int] = []
            async for o in router.generate(rid, ids, params):
                if rid not in first and o.new_token_ids:
                    first[rid] = time.monotonic()
                out += o.new_token_ids
            return out

        async def burst(tag: str) -> list[list[int]]:
            return list(await asyncio.gather(*(one(f"{tag}{i}", p) for i, p in enumerate(prompts))))

        ref = lt.run(burst("ref"))

        async def live_burst() -> list[list[int]]:
            scaler._launch(LoadAction((1,), "network", (0,), multicast=True, live=True, partner=0))
            while not router.instances[1].live_ready:
                await asyncio.sleep(0.01)
            # An idle source pulls tasks before the target has run any layer (k = 0); keep
            # it from asking for a while, as a busy source would, so relays carry hidden
            # states and KV halves over NCCL.
            router.live._asked.add(0)
            task = asyncio.ensure_future(burst("live"))
            await asyncio.sleep(3.0)
            router.live._asked.discard(0)
            outs = await task
            while scaler.busy:
                await asyncio.sleep(0.05)
            return outs

        assert lt.run(live_burst()) == ref
        load = [e for e in scaler.events if e.ranks == (1,)][-1]
        assert load.seconds > 3
        early = [rid for rid, t in first.items() if rid.startswith("live") and t < load.time]
        when = {rid: round(t - load.time, 2) for rid, t in first.items() if rid.startswith("live")}
        stats = (load, router.live.relays_total, router.live.requests_total, router.live.layers_total, when)
        assert early, f"no request got its first token while the new instance was loading: {stats}"
        assert router.live.requests_total > 0 and router.live.layers_total > 0
        assert router.live.relays_total > 0
    finally:
        lt.run(service.stop())
        lt.close()
