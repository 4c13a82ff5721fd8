"""Layer ranges compose: [0, k) then [k, L) gives the logits of [0, L).

Live scaling splits one request's layers across instances, each with its own KV cache for its
layers. The split runs here use separate fresh caches per range (as two instances would),
over a prefill of two sequences of different lengths and then several decode steps; the
result must be bit-identical to one run of all layers, since the same ops run in the same
order. Also: a layer whose weights have not arrived refuses to run.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from blitzscale.errors import WeightsNotReadyError
from blitzscale.kvcache import KVCache
from blitzscale.model import LlamaModel
from blitzscale.model.attention import AttentionMetadata

BLOCK = 16
TABLES = [[3, 0, 5], [1, 4]]  # scattered blocks, two sequences
PROMPT_LENS = [37, 20]
DECODE_STEPS = 3


def steps(vocab: int) -> list[tuple[torch.Tensor, AttentionMetadata]]:
    """A batched prefill then DECODE_STEPS batched decode steps, as (token ids, metadata)."""
    g = torch.Generator().manual_seed(0)
    out = []
    ctx = list(PROMPT_LENS)
    ids = torch.randint(2, vocab, (sum(ctx),), generator=g)
    out.append((ids, AttentionMetadata.build(list(ctx), list(ctx), TABLES, BLOCK, "cpu")))
    for _ in range(DECODE_STEPS):
        ctx = [c + 1 for c in ctx]
        ids = torch.randint(2, vocab, (len(ctx),), generator=g)
        out.append((ids, AttentionMetadata.build([1] * len(ctx), ctx, TABLES, BLOCK, "cpu")))
    return out


def fresh_cache(model: LlamaModel) -> KVCache:
    return KVCache(model.config, 6, BLOCK, model.weights.dtype, "cpu")


@torch.inference_mode()
def run_split(model: LlamaModel, cuts: list[int]) -> list[torch.Tensor]:
    """Logits of every step, running layers in the ranges between `cuts`, one cache per range."""
    bounds = [0, *cuts, model.num_layers]
    caches = [fresh_cache(model) for _ in bounds[:-1]]
    logits = []
    for ids, meta in steps(model.config.vocab_size):
        hidden = model.embed(ids)
        for start, end, cache in zip(bounds[:-1], bounds[1:], caches, strict=True):
            hidden = model.run_layers(hidden, meta, cache, start, end)
        logits.append(model.logits(hidden))
    return logits


def assert_all_equal(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(g, w), f"step {step}: max diff {(g - w).abs().max().item()}"


@pytest.mark.parametrize("preset", ["tiny-llama3", "tiny-qwen2"])
def test_every_two_way_split_equals_full_run(preset: str, tiny_weights) -> None:
    model = LlamaModel(tiny_weights(preset))
    full = run_split(model, [])
    for k in range(model.num_layers + 1):  # k = 0 and k = L are empty ranges
        assert_all_equal(run_split(model, [k]), full)


def test_three_way_split_equals_full_run(tiny_weights) -> None:
    model = LlamaModel(tiny_weights("tiny-llama3"))
    assert_all_equal(run_split(model, [1, 3]), run_split(model, []))


def test_split_smollm2_equals_full_run(smollm2_weights: Any) -> None:
    model = LlamaModel(smollm2_weights, max_positions=128)
    full = run_split(model, [])
    for cuts in ([15], [1, 29]):
        assert_all_equal(run_split(model, cuts), full)


def test_split_matches_single_cache_full_run(tiny_weights) -> None:
    """Sanity of the helper: one cache for all layers gives the same as separate caches."""
    model = LlamaModel(tiny_weights("tiny-mistral"))
    cache = fresh_cache(model)
    with torch.inference_mode():
        one = [model.forward(ids, meta, cache) for ids, meta in steps(model.config.vocab_size)]
    assert_all_equal(run_split(model, [2]), one)


def test_layer_that_has_not_arrived_refuses_to_run(tiny_weights) -> None:
    from blitzscale.checkpoint import load_weights, resolve_model

    weights = load_weights(resolve_model("random:tiny-llama3"))  # own copy: readiness changes
    weights.readiness.reset()
    model = LlamaModel(weights)
    ids, meta = steps(model.config.vocab_size)[0]
    cache = fresh_cache(model)
    for seg in range(1 + 2):  # embedding and layers 0, 1 have arrived
        weights.readiness.add(seg)
    with torch.inference_mode():
        hidden = model.run_layers(model.embed(ids), meta, cache, 0, 2)
        with pytest.raises(WeightsNotReadyError, match="layer 2"):
            model.run_layers(hidden, meta, cache, 2, 4)
        for seg in range(3, len(weights.layout.segments)):
            weights.readiness.add(seg)
        late = model.logits(model.run_layers(hidden, meta, cache, 2, 4))
    ref = LlamaModel(tiny_weights("tiny-llama3"))
    with torch.inference_mode():
        want = ref.forward(ids, meta, fresh_cache(ref))
    assert torch.equal(late, want)
