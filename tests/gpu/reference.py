"""The tokens a local engine gives on the exact weights a cluster's workers load."""

from __future__ import annotations

from typing import Any

from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.engine.engine import default_dtype


def local_tokens(
    model: str, cache_dir: Any, prompts: list[list[int]], params: SamplingParams
) -> list[list[int]]:
    """Random weights depend on the device and the dtype that make them, so load the folder
    the workers read (converted in their dtype, as serve converts it), on the GPU, and
    generate there. The engine's memory goes back to the device afterwards: the workers
    started next size their KV caches from what is free."""
    import gc

    import torch

    from blitzscale.checkpoint import load_weights, resolve_model
    from blitzscale.cluster.config import ClusterConfig
    from blitzscale.serve.model_cache import prepare_model

    folder = prepare_model(model, str(cache_dir), dtype=ClusterConfig(device="cuda").resolved_dtype)
    w = load_weights(resolve_model(folder), dtype=default_dtype("cuda"), device="cuda")
    engine = LLMEngine(w, None, EngineConfig(block_size=16))
    out = [o.token_ids for o in engine.generate(prompts, params)]
    del engine, w
    gc.collect()  # (the engine's parts refer to each other: a cycle keeps its KV cache)
    torch.cuda.empty_cache()
    return out
