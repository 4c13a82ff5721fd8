"""The GPU path against the reference path on the same weights (bf16, CUDA).

- the Triton attention kernels against SDPA on random paged caches: mixed decode rows and
  prefill chunks (with and without a cached prefix), lengths on and off block boundaries,
  long contexts split across programs, GQA groups of 1, 2 and 4, page sizes 16 and 64;
- whole models (Triton backend + fused ops) against the reference backend over a prefill,
  a mixed chunked step and decode steps across block boundaries, running the layers as live
  ranges with one fresh cache per range;
- the decode CUDA graph against the eager step, and the GPU sampler.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from blitzscale.checkpoint import load_weights, resolve_model
from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.engine.sampler import NO_TOKEN, sample
from blitzscale.kvcache import KVCache
from blitzscale.model import LlamaModel
from blitzscale.model.attention import AttentionMetadata, ReferenceBackend

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _tables(ctx: list[int], page: int, num_blocks: int, seed: int) -> list[list[int]]:
    """Disjoint, shuffled blocks for each sequence."""
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
    out, at = [], 0
    for c in ctx:
        n = -(-c // page)
        out.append(perm[at : at + n])
        at += n
    return out


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "page"), [(32, 8, 128, 64), (8, 2, 16, 16), (4, 4, 32, 16)]
)
@pytest.mark.parametrize(
    ("query_lens", "context_lens"),
    [
        ([1], [1]),
        ([1, 1, 1], [64, 65, 2049]),  # a block boundary either side, a long split context
        ([1, 37, 1, 16, 130], [300, 37, 17, 48, 130]),  # decode rows between fresh prompts
        ([1, 24, 1, 64], [4000, 40, 63, 192]),  # chunks with cached prefixes
        ([200, 1, 64], [200, 9, 64]),  # whole prompts only (SDPA unless told otherwise)
    ],
)
@pytest.mark.parametrize("fresh_prefill", ["sdpa", "triton"])
@torch.inference_mode()
def test_triton_attention_matches_sdpa(
    heads: int,
    kv_heads: int,
    head_dim: int,
    page: int,
    query_lens: list[int],
    context_lens: list[int],
    fresh_prefill: str,
) -> None:
    from blitzscale.model.attention.triton_backend import TritonBackend

    backend = TritonBackend()
    backend.fresh_prefill = fresh_prefill
    g = torch.Generator(device="cuda").manual_seed(0)
    num_blocks = sum(-(-c // page) for c in context_lens) + 3
    tables = _tables(context_lens, page, num_blocks, 1)
    shape = (num_blocks, page, kv_heads, head_dim)
    kc = torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16)
    t = sum(query_lens)
    qkv = torch.randn(t, (heads + 2 * kv_heads) * head_dim, generator=g, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
    q, k, v = q.view(t, heads, head_dim), k.view(t, kv_heads, head_dim), v.view(t, kv_heads, head_dim)
    scale = head_dim**-0.5
    kc_ref, vc_ref = kc.float(), vc.float()
    ref = ReferenceBackend().forward(
        q.float(), k.float(), v.float(), kc_ref, vc_ref,
        AttentionMetadata.build(query_lens, context_lens, tables, page, "cuda"), scale,
    )  # fmt: skip
    out = backend.forward(
        q, k, v, kc, vc, AttentionMetadata.build(query_lens, context_lens, tables, page, "cuda"), scale
    )
    assert torch.equal(kc.float(), kc_ref) and torch.equal(vc.float(), vc_ref)  # the stores
    assert (out.float() - ref).abs().max() < 3e-2
    assert F.cosine_similarity(out.float().flatten(1), ref.flatten(1), dim=-1).min() > 0.9995


BLOCK = 16


def _steps(vocab: int) -> list[tuple[torch.Tensor, AttentionMetadata, list[list[int]]]]:
    """(ids, metadata) of: a prefill of 3 prompts (one a first chunk ending on a block
    boundary), a mixed step (decodes, that prompt's second chunk, a new prompt), then decode
    steps whose contexts cross block boundaries."""
    g = torch.Generator().manual_seed(0)
    tables = [[3, 0, 5, 11], [1, 4, 9], [2, 6, 7, 8], [10, 12, 13]]
    plan = [([37, 16, 5], [37, 16, 5], [0, 1, 2]), ([1, 24, 1, 17], [38, 40, 6, 17], [0, 1, 2, 3])]
    ctx = [38, 40, 6, 17]
    for _ in range(12):
        ctx = [c + 1 for c in ctx]
        plan.append(([1] * 4, list(ctx), [0, 1, 2, 3]))
    out = []
    for q, c, seqs in plan:
        ids = torch.randint(2, vocab, (sum(q),), generator=g).cuda()
        out.append((ids, AttentionMetadata.build(q, c, [tables[s] for s in seqs], BLOCK, "cuda"), seqs))
    return out


@pytest.mark.parametrize("preset", ["tiny-llama3", "tiny-qwen2"])
@torch.inference_mode()
def test_gpu_model_matches_reference_over_live_layer_ranges(preset: str) -> None:
    weights = load_weights(resolve_model(f"random:{preset}"), dtype=torch.bfloat16, device="cuda")
    ref = LlamaModel(weights, backend="reference")
    gpu = LlamaModel(weights)
    assert gpu.attn.name == "triton" and gpu.ops.name == "triton" and ref.ops.name == "torch"
    n = gpu.num_layers
    cuts = [0, n // 2, n]  # two live ranges, each with its own cache (two instances)
    ref_kv = KVCache(weights.config, 14, BLOCK, torch.bfloat16, "cuda")
    gpu_kv = [KVCache(weights.config, 14, BLOCK, torch.bfloat16, "cuda") for _ in cuts[:-1]]
    for ids, meta, _ in _steps(weights.config.vocab_size):
        want = ref.forward(ids, meta, ref_kv).float()
        meta = AttentionMetadata.build(list(meta.query_lens), list(meta.context_lens),
                                       meta.block_tables.tolist(), BLOCK, "cuda")  # fmt: skip
        hidden = gpu.embed(ids)
        for a, b, kv in zip(cuts[:-1], cuts[1:], gpu_kv, strict=True):
            hidden = gpu.run_layers(hidden, meta, kv, a, b)
        got = gpu.logits(hidden).float()
        assert F.cosine_similarity(got, want, dim=-1).min() > 0.999
        assert (got - want).abs().max() <= 0.03 * want.abs().max()


@torch.inference_mode()
def test_decode_graph_matches_eager_step_and_engine_is_consistent() -> None:
    weights = load_weights(resolve_model("random:tiny-llama3"), dtype=torch.bfloat16, device="cuda")
    engine = LLMEngine(weights, None, EngineConfig(block_size=16, num_kv_blocks=64, max_num_seqs=8))
    graphs = engine.runner.graphs
    assert graphs is not None and graphs.buckets == [1, 2, 4, 8]
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 500, (n,), generator=g).tolist() for n in (3, 16, 33)]
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    with_graphs = [o.token_ids for o in engine.generate(prompts, params)]
    assert engine.pool.num_free_blocks == engine.pool.num_blocks
    # one decode step both ways on the same cache contents
    ids = [p[-1] for p in prompts]
    ctx = [len(p) for p in prompts]
    tables = [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    kv = engine.kv_cache
    before = kv.data.clone()
    graph_logits = graphs.run(ids, ctx, tables).clone()
    kv.data.copy_(before)
    meta = AttentionMetadata.build([1, 1, 1], ctx, tables, 16, "cuda")
    eager = engine.model.forward(torch.tensor(ids, device="cuda"), meta, kv).float()
    assert F.cosine_similarity(graph_logits, eager, dim=-1).min() > 0.9995
    engine.runner.graphs = None
    without = [o.token_ids for o in engine.generate(prompts, params)]
    assert [len(t) for t in without] == [len(t) for t in with_graphs] == [20] * 3


@torch.inference_mode()
def test_gpu_sampler_greedy_seeded_and_non_finite() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(7, 1000, generator=g, device="cuda")
    logits[4, 3] = float("nan")
    params = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.0, seed=5),
        SamplingParams(temperature=0.7, top_k=20, top_p=0.9),
        SamplingParams(temperature=1.0, top_k=1),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=1.0, top_p=0.5, seed=9),
        SamplingParams(temperature=1.0, min_p=0.9),  # only tokens within 0.1 of the best logit
    ]

    def gens() -> list[torch.Generator | None]:
        return [None if p.seed is None else torch.Generator().manual_seed(p.seed) for p in params]

    a, b = sample(logits, params, gens()), sample(logits, params, gens())
    top = logits.argmax(-1).tolist()
    assert a[0] == top[0] and a[3] == top[3] and a[4] == NO_TOKEN
    assert a[1] == b[1] and a[5] == b[5]  # seeded rows repeat
    assert a[2] in logits[2].topk(20).indices.tolist()
    near = (logits[6] >= logits[6].max() + torch.log(torch.tensor(0.9))).nonzero().flatten().tolist()
    assert a[6] in near and b[6] in near
    cpu = sample(logits.cpu(), params, gens())
    assert cpu[1] == a[1] and cpu[5] == a[5]  # the same seeded stream as on CPU
