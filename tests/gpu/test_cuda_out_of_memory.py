"""A real CUDA out-of-memory error inside a step (engine/oom.py): the engine retries smaller
steps and every request gets the tokens it gets with room to spare.

The caching allocator is held to a per-process limit just above what the engine holds once
built (weights, KV cache, graphs) plus a quarter of the activations its largest step
needed in a run without the limit: the first big prefill cannot fit, smaller ones can.
Run on a GPU machine with `make test-gpu`.
"""

from __future__ import annotations

import pytest
import torch

from blitzscale.checkpoint import load_weights, resolve_model
from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CFG = EngineConfig(block_size=16, num_kv_blocks=1024, max_num_batched_tokens=8192, max_num_seqs=64)


def _serve(engine: LLMEngine, prompts: list[list[int]]) -> dict[str, list[int]]:
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(p, params, request_id=f"r{i}")
    out: dict[str, list[int]] = {}
    steps = 0
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                assert not o.error, o.error
                out[o.request_id] = o.token_ids
        steps += 1
        assert steps < 5000, "the engine never finished"
    assert engine.pool.num_used_blocks == 0
    return out


@torch.inference_mode()
def test_a_real_cuda_out_of_memory_retries_smaller_steps() -> None:
    weights = load_weights(resolve_model("random:tiny-llama3"), dtype=torch.float32, device="cuda")
    g = torch.Generator().manual_seed(29)
    vocab = weights.config.vocab_size
    prompts = [torch.randint(0, vocab, (500 + 7 * i,), generator=g).tolist() for i in range(16)]

    roomy = LLMEngine(weights, None, CFG)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    want = _serve(roomy, prompts)
    activations = torch.cuda.max_memory_allocated() - base
    assert activations > 4 << 20, f"the largest step needed only {activations} bytes: no test"
    del roomy

    tight = LLMEngine(weights, None, CFG)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    limit = torch.cuda.memory_reserved() + activations // 4
    torch.cuda.set_per_process_memory_fraction(limit / total)
    try:
        got = _serve(tight, prompts)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert tight.backoff.retries > 0, "no step ran out of memory: the limit did not bite"
    assert tight.backoff.failures == 0
    assert got == want
