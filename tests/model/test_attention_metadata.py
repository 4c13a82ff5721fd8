"""A step's attention metadata stays linear in the step, and the reference backend's mixed
step (decode rows batched, prefill chunks with and without a cached prefix) equals plain
causal attention computed one sequence and one head at a time."""

from __future__ import annotations

import torch

from blitzscale.model.attention import AttentionMetadata, ReferenceBackend


def _nbytes(meta: AttentionMetadata) -> int:
    fields = (meta.positions, meta.slot_mapping, meta.block_tables, meta.seq_lens)
    fields += (meta.query_start_loc, meta.decode_seqs, meta.prefill_seqs)
    return sum(t.numel() * t.element_size() for t in fields)


def test_metadata_and_plan_are_linear_in_the_step() -> None:
    """63 decodes at 2048 tokens plus one 2048-token chunk: the old dense mask was
    [64, 1, 2048, 2112] booleans (277 MB); now a few hundred KB."""
    block, ctx = 64, 2048
    q = [1] * 63 + [2048]
    c = [ctx] * 63 + [2048]
    nb = ctx // block + 1
    tables = [list(range(i * nb, (i + 1) * nb)) for i in range(64)]
    meta = AttentionMetadata.build(q, c, tables, block, "cpu")
    plan = ReferenceBackend().prepare(meta)
    tokens, table_entries = sum(q), 64 * nb
    assert _nbytes(meta) <= 8 * (4 * tokens + table_entries + 4 * 65)
    assert plan.decode is not None and plan.decode.key_mask.numel() == 63 * ctx  # its blocks only
    assert [p.num_new for p in plan.prefills] == [2048]


def _dense(q, k_all, v_all, start: int, scale: float) -> torch.Tensor:
    """q [n, h, d] at positions start.. over keys k_all/v_all [S, kvh, d], causal."""
    n, h, _ = q.shape
    group = h // k_all.shape[1]
    out = torch.empty_like(q)
    for head in range(h):
        k, v = k_all[:, head // group], v_all[:, head // group]
        for i in range(n):
            s = (q[i, head] @ k[: start + i + 1].T) * scale
            out[i, head] = s.softmax(-1) @ v[: start + i + 1]
    return out


@torch.inference_mode()
def test_reference_mixed_step_equals_dense_attention() -> None:
    g = torch.Generator().manual_seed(0)
    block, heads, kv_heads, dim = 16, 4, 2, 8
    query_lens = [1, 5, 1, 9, 16]
    context_lens = [20, 5, 33, 40, 16]  # decode, fresh prompt, decode, chunk with prefix, block-sized
    perm = torch.randperm(20, generator=g).tolist()
    tables, at = [], 0
    for c in context_lens:
        n = -(-c // block)
        tables.append(perm[at : at + n])
        at += n
    k_cache = torch.randn(20, block, kv_heads, dim, generator=g)
    v_cache = torch.randn(20, block, kv_heads, dim, generator=g)
    t = sum(query_lens)
    q = torch.randn(t, heads, dim, generator=g)
    k = torch.randn(t, kv_heads, dim, generator=g)
    v = torch.randn(t, kv_heads, dim, generator=g)
    meta = AttentionMetadata.build(query_lens, context_lens, tables, block, "cpu")
    out = ReferenceBackend().forward(q, k, v, k_cache, v_cache, meta, dim**-0.5)
    first = 0
    for n, c, table in zip(query_lens, context_lens, tables, strict=True):
        slots = [table[p // block] * block + p % block for p in range(c)]
        k_all = k_cache.view(-1, kv_heads, dim)[slots]
        v_all = v_cache.view(-1, kv_heads, dim)[slots]
        assert torch.equal(k_all[c - n :], k[first : first + n])  # the step's keys were stored
        want = _dense(q[first : first + n], k_all, v_all, c - n, dim**-0.5)
        torch.testing.assert_close(out[first : first + n], want, atol=1e-5, rtol=1e-5)
        first += n


def test_every_field_starts_on_16_bytes_whatever_the_step_shape() -> None:
    """Triton specializes a kernel on its pointers' 16-byte alignment: fields at varying
    alignment compiled new variants mid-serving. Values are unchanged by the padding."""
    g = torch.Generator().manual_seed(1)
    for _ in range(30):
        n = int(torch.randint(1, 7, (1,), generator=g))
        q_lens = torch.randint(1, 40, (n,), generator=g).tolist()
        ctx = [q + int(torch.randint(0, 50, (1,), generator=g)) for q in q_lens]
        tables = [list(range(-(-c // 16))) for c in ctx]
        extra = [list(range(sum(q_lens))), [len(q_lens)] * 3]
        meta, (ids, rows) = AttentionMetadata.build_with(q_lens, ctx, tables, 16, "cpu", extra)
        fields = [meta.positions, meta.slot_mapping, meta.block_tables, meta.seq_lens, meta.query_start_loc]
        fields += [meta.decode_seqs, meta.prefill_seqs, ids, rows]
        assert all(f.data_ptr() % 16 == 0 for f in fields)
        assert meta.seq_lens.tolist() == ctx and ids.tolist() == extra[0] and rows.tolist() == extra[1]
        assert meta.block_tables.shape == (n, max(len(t) for t in tables))
        assert meta.query_start_loc.tolist() == [sum(q_lens[:i]) for i in range(n + 1)]
