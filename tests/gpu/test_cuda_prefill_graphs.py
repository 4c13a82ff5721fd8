"""Steps of one prompt chunk replay a captured graph (engine/prefill_graphs.py): its logits
are the eager forward's (bf16: close), for a fresh chunk and one that follows a prefix in
the cache; the engine sends such steps there, and chunks past the largest bucket run eagerly.

Run on a GPU machine with `make test-gpu`.
"""

from __future__ import annotations

import pytest
import torch

from blitzscale.checkpoint import load_weights, resolve_model
from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.model.attention import AttentionMetadata

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _engine(budget: int = 300) -> LLMEngine:
    w = load_weights(resolve_model("random:tiny-llama3"), dtype=torch.bfloat16, device="cuda")
    cfg = EngineConfig(block_size=16, num_kv_blocks=512, max_num_batched_tokens=budget, prefix_caching=True)
    return LLMEngine(w, None, cfg)


@torch.inference_mode()
@pytest.mark.parametrize(("start", "n"), [(0, 2), (0, 40), (0, 256), (160, 98), (600, 100), (37, 5)])
def test_a_replayed_chunk_gives_the_eager_logits(start: int, n: int) -> None:
    e = _engine()
    pg = e.runner.prefill_graphs
    assert pg is not None and pg.buckets[-1] == 256
    model, kv, bs = e.model, e.kv_cache, e.kv_cache.block_size
    g = torch.Generator().manual_seed(start + n)
    ids = torch.randint(0, 512, (start + n,), generator=g).tolist()
    table = torch.randperm(64, generator=g)[: -(-(start + n) // bs)].add(1).tolist()  # scattered blocks

    def eager(first: int, count: int) -> torch.Tensor:
        meta = AttentionMetadata.build([count], [first + count], [table], bs, "cuda")
        hidden = model.run_layers(model.embed(torch.tensor(ids[first : first + count]).cuda()), meta, kv)
        return model.logits(hidden[-1:]).float()

    if start:
        eager(0, start)  # the prefix into the cache
    ref = eager(start, n)
    ours = pg.run(ids[start:], start, table, sample=True).clone()
    assert ours.shape == ref.shape == (1, e.model_config.vocab_size)
    scale = ref.abs().max()
    assert (ours - ref).abs().max() <= 0.02 * scale
    assert ours.argmax() == ref.argmax()
    assert pg.run(ids[start:], start, table, sample=False).shape[0] == 0  # a chunk that samples nothing


@torch.inference_mode()
def test_the_engine_replays_one_prompt_steps_up_to_the_largest_bucket() -> None:
    e = _engine()
    pg = e.runner.prefill_graphs
    assert pg is not None
    replays: list[tuple[int, int]] = []
    run = pg.run

    def counted(token_ids: list[int], start: int, *rest: object) -> torch.Tensor:
        replays.append((start, len(token_ids)))
        return run(token_ids, start, *rest)  # type: ignore[arg-type]

    pg.run = counted  # type: ignore[method-assign]
    g = torch.Generator().manual_seed(3)
    shared = torch.randint(0, 512, (200,), generator=g).tolist()
    prompts = [
        shared + torch.randint(0, 512, (37,), generator=g).tolist(),  # 237 fresh tokens
        shared + torch.randint(0, 512, (90,), generator=g).tolist(),  # 192 cached, 98 new
        torch.randint(0, 512, (700,), generator=g).tolist(),  # chunks of 300, 300 (eager), 100
        [7, 8],
    ]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    outs = [e.generate([p], params)[0] for p in prompts]  # one at a time: one chunk a step
    assert all(len(o.token_ids) == 12 for o in outs)
    assert replays == [(0, 237), (192, 98), (600, 100), (0, 2)]
    assert e.pool.num_free_blocks == e.pool.num_blocks
    e.check_integrity()
