"""Mixed steps' pieces (engine/mixed_graphs.py) on a CPU, where each piece runs directly
where a GPU replays its CUDA graph: the static buffers, the padding to a token bucket and
the attention run between the pieces give the eager forward's logits (fp32, within
rounding), for decode rows, a chunk after a cached prefix and a whole prompt in one step,
and a smaller step after a larger one in the same bucket (stale padding rows). The CUDA
graphs themselves: tests/gpu/test_cuda_mixed_graphs.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from blitzscale.engine import EngineConfig, LLMEngine
from blitzscale.engine.mixed_graphs import MixedGraphs
from blitzscale.kvcache.cache import KVCache
from blitzscale.model.attention import AttentionMetadata
from blitzscale.model.llama import LlamaModel

STEPS = [
    # (cached tokens, new tokens) per sequence, each step on its own sequences
    [(40, 1), (17, 1), (0, 30)],  # 32 tokens: bucket 32
    [(100, 1), (64, 70), (3, 1), (0, 9)],  # 81: bucket 96
    [(5, 1)] * 6 + [(200, 90)],  # 96: bucket 96, after a smaller step there
    [(0, 12), (0, 7)],  # two whole prompts, no decode row: 19, bucket 32
]


def prefilled_step(
    model: LlamaModel, kv: KVCache, seqs: list[tuple[int, int]], g: torch.Generator, free: list[int]
) -> tuple[torch.Tensor, Callable[[], AttentionMetadata]]:
    """A step of sequences `seqs` ((cached tokens, new tokens) each) on blocks taken from the
    front of `free` (removed from it), random tokens, their cached prefixes run into `kv`
    first: the step's new token ids (on the model's device) and a maker of its metadata
    (one for each forward: a backend keeps its plan on it)."""
    vocab, bs, dev = model.config.vocab_size, kv.block_size, model.weights.device
    ids = [torch.randint(0, vocab, (c + n,), generator=g).tolist() for c, n in seqs]
    tables = []
    for c, n in seqs:
        need = -(-(c + n) // bs)
        tables.append(free[:need])
        del free[:need]
    for (c, _), t, x in zip(seqs, tables, ids, strict=True):
        if c:
            meta = AttentionMetadata.build([c], [c], [t], bs, dev)
            model.run_layers(model.embed(torch.tensor(x[:c], device=dev)), meta, kv)
    step = torch.tensor([tok for (c, _), x in zip(seqs, ids, strict=True) for tok in x[c:]], device=dev)
    q_lens, ctx = [n for _, n in seqs], [c + n for c, n in seqs]
    return step, lambda: AttentionMetadata.build(q_lens, ctx, tables, bs, dev)


@pytest.mark.parametrize("preset", ["tiny-llama3", "tiny-qwen2"])
@torch.inference_mode()
def test_pieces_give_the_eager_logits(tiny_weights: Any, preset: str) -> None:
    cfg = EngineConfig(block_size=16, num_kv_blocks=256, max_model_len=512)
    e = LLMEngine(tiny_weights(preset), None, cfg)
    m, kv = e.model, e.kv_cache
    mg = MixedGraphs(m, kv, 300)
    mg.capture()
    assert mg.buckets[-1] == 288 and len(mg.graphs[32]) == m.num_layers + 1
    g = torch.Generator().manual_seed(7)
    free = torch.randperm(250, generator=g).add(1).tolist()  # scattered blocks, none shared
    for seqs in STEPS:
        step, meta = prefilled_step(m, kv, seqs, g, free)
        ref = m.logits(m.run_layers(m.embed(step), meta(), kv))
        ours = m.logits(mg.run(step, meta()))
        assert ours.shape == ref.shape == (len(step), e.model_config.vocab_size)
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))
        assert torch.equal(ours.argmax(-1), ref.argmax(-1))
