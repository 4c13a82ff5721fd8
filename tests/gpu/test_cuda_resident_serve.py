"""Several models resident on one GPU by default: `[cluster] models_per_rank` left at 0,
serve derives it once its worker has said the device's memory (two tiny models fit many
times over: two slots), builds the worker's standby engine again for its share of the
device, and both models serve from one GPU at once, the first from the rebuilt standby,
with the tokens of a local engine. Run on the GPU machine: `make test-gpu`."""

from __future__ import annotations

import asyncio

import pytest
import torch
from prometheus_client import generate_latest

from blitzscale.cluster.slotted import SlottedCluster
from blitzscale.engine import SamplingParams
from blitzscale.serve.background import LoopThread
from blitzscale.serve.config import ModelEntry, ServeConfig
from blitzscale.serve.server import ServingCluster
from tests.gpu.reference import local_tokens

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
MODEL = "random:tiny-llama3"


def test_two_models_are_resident_on_one_gpu_without_being_asked(tmp_path) -> None:
    cfg = ServeConfig().with_overrides(
        model={"cache_dir": str(tmp_path), "keep_alive_s": 3600.0},
        cluster={"num_workers": 1, "device": "cuda"},
        router={"mode": "colocated"},
        engine={"max_model_len": 512},
        models=[ModelEntry(m, MODEL, min_instances=1) for m in ("a", "b")],
    )
    assert cfg.cluster.models_per_rank == 0  # (the default: derived)
    prompts = [list(range(3 + i, 40 + 7 * i)) for i in range(3)]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    ref = local_tokens(MODEL, tmp_path, prompts, params)

    lt = LoopThread()
    service = ServingCluster(cfg)
    try:
        lt.run(service.start())
        cluster, router = service.cluster, service.router
        assert isinstance(cluster, SlottedCluster) and cluster.per_rank == 2
        assert cluster.inner.standby.engine.models_per_device == 2

        async def one(model: str, i: int) -> list[int]:
            out: list[int] = []
            assert router is not None
            async for o in router.generate(f"{model}{i}", prompts[i], params, model=model):
                out += o.new_token_ids
            return out

        async def both() -> list[list[int]]:
            return list(await asyncio.gather(*(one(m, i) for m in ("a", "b") for i in range(len(prompts)))))

        assert lt.run(both()) == ref + ref
        assert sorted(cluster.pool.gpu_holders("a") + cluster.pool.gpu_holders("b")) == [0, 1]  # two slots
        text = generate_latest(service.registry).decode()
        assert 'blitzscale_activations_total{engine="standby"} 1.0' in text, text
    finally:
        lt.run(service.stop())
        lt.close()
