"""Several models resident on one GPU (`EngineConfig.models_per_device`, serve's `[cluster]
models_per_rank`): each engine's KV cache is its equal share of the device's memory less
its own weights, whatever the others hold, so engines built one after another get the same
cache and all fit. Run on the GPU machine: `make test-gpu`."""

from __future__ import annotations

import pytest
import torch

from blitzscale.model.weights import ModelWeights

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_engines_of_resident_models_each_take_their_share_of_the_device() -> None:
    from blitzscale.checkpoint import load_config, resolve_model
    from blitzscale.engine import EngineConfig, LLMEngine
    from blitzscale.kvcache.cache import KVCache

    cfg = load_config(resolve_model("random:tiny-llama3"))
    per_rank, util = 3, 0.3
    engine_cfg = EngineConfig(models_per_device=per_rank, gpu_memory_utilization=util, max_model_len=512)
    _, total = torch.cuda.mem_get_info()
    before = torch.cuda.memory_allocated()  # (what earlier tests in this process still hold)
    engines = []
    for _ in range(per_rank):
        w = ModelWeights.empty(cfg, torch.bfloat16, "cuda")
        w.readiness.mark_all_ready()
        engines.append(LLMEngine(w, None, engine_cfg))
    per_block = KVCache.bytes_per_block(cfg, engine_cfg.block_size, torch.bfloat16, 1)
    share = int(total * util) // per_rank
    want = (share - w.layout.nbytes) // per_block
    assert [e.counts()["total_blocks"] for e in engines] == [want] * per_rank
    held = torch.cuda.memory_allocated() - before
    assert held <= int(total * util) + (1 << 30), (held, before, total)  # (graphs and buffers aside)
