"""Overlapped decoding on a GPU: the same tokens as reading every step at once.

bf16 with the Triton backend and CUDA graphs (requests that run to max_tokens: both modes
then run the same batches, so the same kernels, and tokens must be bit-identical), and fp32
with early stops (a stopped request's extra row changes batch shapes; fp32 greedy tokens do
not depend on them). Run on a GPU machine with `make test-gpu`.
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


def _serve(weights, overlap: str, arrivals: dict[int, list[tuple[str, list[int], SamplingParams]]]):
    """Final token ids by request, with requests added before the given steps."""
    e = LLMEngine(
        weights, None, EngineConfig(block_size=16, num_kv_blocks=256, max_num_seqs=16, overlap=overlap)
    )
    final: dict[str, list[int]] = {}
    k = 0
    while k <= max(arrivals) or e.has_unfinished():
        for rid, prompt, params in arrivals.get(k, []):
            e.add_request(prompt, params, request_id=rid)
        for o in e.step():
            assert all(t >= 0 for t in o.token_ids), o
            if o.finished:
                final[o.request_id] = o.token_ids
        e.check_integrity()
        k += 1
    assert e.pool.num_free_blocks == e.pool.num_blocks
    return final, (e.overlap.steps if e.overlap is not None else 0)


def _prompts(n: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, vocab, (5 + 9 * i,), generator=g).tolist() for i in range(n)]


@torch.inference_mode()
def test_bf16_graph_decode_overlapped_is_bit_identical() -> None:
    w = load_weights(resolve_model("random:tiny-llama3"), dtype=torch.bfloat16, device="cuda")
    ps = _prompts(6, w.config.vocab_size)
    p = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    arrivals = {0: [(f"r{i}", ps[i], p) for i in range(4)], 9: [("r4", ps[4], p)], 15: [("r5", ps[5], p)]}
    on, steps = _serve(w, "on", arrivals)
    off, _ = _serve(w, "off", arrivals)
    assert on == off
    assert steps >= 20


@torch.inference_mode()
def test_fp32_early_stops_overlapped_match() -> None:
    w = load_weights(resolve_model("random:tiny-qwen2"), dtype=torch.float32, device="cuda")
    ps = _prompts(5, w.config.vocab_size)
    alone = LLMEngine(w, None, EngineConfig(block_size=16, num_kv_blocks=64, overlap="off"))
    probe = alone.generate([ps[0]], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0]
    stop = probe.token_ids[5]  # a token the model does emit: some requests stop early on it
    p = SamplingParams(max_tokens=20, temperature=0, stop_token_ids=(stop,), ignore_eos=True)
    arrivals = {0: [(f"r{i}", ps[i], p) for i in range(5)]}
    on, steps = _serve(w, "auto", arrivals)  # auto: on, on a GPU
    off, _ = _serve(w, "off", arrivals)
    assert on == off
    assert steps >= 3
    assert any(len(t) < 20 for t in on.values())
