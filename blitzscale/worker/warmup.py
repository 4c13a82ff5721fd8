"""Make a GPU worker's first real forward pass free of one-time initialisation.

A live target computes while NCCL receives of its weight transfer are posted and waiting
for data. Anything that has to wait for the whole device to go idle then stalls until the
transfer ends: loading a kernel module on its first launch, creating the thread's cuBLAS
handle. Kernels are loaded eagerly (`CUDA_MODULE_LOADING=EAGER`, set in `worker_main`);
this runs a tiny model through a real engine on the thread that will serve, before any
transfer, so the rest of that state exists too (on CUDA in bf16 that engine also compiles
the Triton kernels for the tiny shapes and captures its decode graphs). The served model's
own kernels are compiled, and its graphs captured, when its engine is built: Triton
specialises on shapes such as the head count, and graphs hold the instance's addresses.
"""

from __future__ import annotations

import torch

WARMUP_MODEL = "random:tiny-llama3"


def warm_up_compute(device: torch.device, dtype: torch.dtype) -> None:
    from blitzscale.checkpoint import load_weights, resolve_model
    from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams

    weights = load_weights(resolve_model(WARMUP_MODEL), dtype=dtype, device=device)
    engine = LLMEngine(weights, None, EngineConfig(block_size=16, num_kv_blocks=64, max_model_len=256))
    prompts = [list(range(3, 40)), list(range(5, 9))]
    engine.generate(prompts, SamplingParams(max_tokens=3, temperature=0.0))
    engine.generate(prompts, SamplingParams(max_tokens=3, temperature=0.8, top_p=0.9, top_k=5, seed=1))
    kv = engine.kv_cache
    kv.scatter_blocks([0, 1], kv.gather_blocks([2, 3], (0, 1)), (0, 1))
    torch.cuda.synchronize(device)
