"""The tokens a local engine gives on the exact weights a cluster's workers load."""

from __future__ import annotations

from typing import Any

from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.engine.engine import default_dtype


def local_tokens(
    model: str, cache_dir: Any, prompts: list[list[int]], params: SamplingParams
) -> list[list[int]]:
    """Random weights depend on the device that makes them, so load the converted folder the
    workers read, on the GPU, and generate there."""
    from blitzscale.checkpoint import load_weights, resolve_model
    from blitzscale.serve.server import prepare_model

    folder = prepare_model(model, str(cache_dir))
    w = load_weights(resolve_model(folder), dtype=default_dtype("cuda"), device="cuda")
    return [o.token_ids for o in LLMEngine(w, None, EngineConfig(block_size=16)).generate(prompts, params)]
