"""CUDA graphs of mixed steps, piece by piece around attention.

A step that is neither all decode rows (engine/cuda_graphs.py) nor one prompt chunk
(engine/prefill_graphs.py), above all decode rows with a prompt chunk riding along, ran
eagerly, bound by the host's Python and kernel launches, and under load most steps are
such: on H100s, Llama-3-8B, a 96-token prompt joining 32 rows decoding at 2,048 keys took
15-23 ms eagerly against 12-14 replayed this way, depending on the host
(docs/benchmarks.md, "Mixed steps as piecewise CUDA graphs"). Its attention cannot be
captured once for every mix (the kernels' grids follow how many rows decode and how long
the chunks are), but everything between two attentions works row by row and depends only
on the step's token count. So for each token bucket there are L + 1 graphs: the embedding
and layer 0 up to its attention; then, for each layer i, layer i from its attention output
on and layer i + 1 up to its attention; the last layer's rest and the final residual add.
Between them the step's attention runs eagerly on its real rows (two to four launches a
layer). Rows past the step's tokens are padding: row-wise work on stale values that
nothing reads.

The pieces talk through static buffers (token ids, the residual stream, qkv, the attention
output); each piece's temporaries live in the graphs' shared pool. Captured when the engine
is built, before any request and without the weights, as the other graphs are. On a CPU
(tests) the pieces run directly where they would replay, so the same buffers, padding and
attention between them are checked there against the eager forward.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import torch

from blitzscale.engine.cuda_graphs import capture_buckets, smallest_bucket
from blitzscale.kvcache.cache import KVCache
from blitzscale.model.attention import AttentionMetadata
from blitzscale.model.fp8_values import scaled
from blitzscale.model.llama import LlamaModel

# Token buckets: up to 128 tokens a step reads the weights in about the same time whatever
# its rows, so padding is nearly free; past that the matmuls' time grows with the rows,
# and the buckets are 32 tokens apart up to 512, 64 to 768, so that padding adds at most
# 1/8 (a 544-token step padded to 768 took 23.2 ms against 19.8 eagerly on an H100:
# docs/results/mixed_graphs_bench_h100_s29_run1.json). Past 768 tokens a step's kernels
# outlast its launches: an eager step costs nothing a graph would save.
BUCKETS = (16, 32, 64, 96, 128, *range(160, 513, 32), 576, 640, 704, 768)


class Piece(Protocol):
    def replay(self) -> None: ...


class _Direct:
    """A piece run as it is, where no CUDA graph can hold it (CPU)."""

    def __init__(self, run: Callable[[], torch.Tensor]) -> None:
        self.run = run

    def replay(self) -> None:
        self.run()


class MixedGraphs:
    def __init__(self, model: LlamaModel, kv_cache: KVCache, max_tokens: int) -> None:
        """Buckets up to `max_tokens` (a step's token budget) and BUCKETS' last."""
        self.model = model
        self.kv_cache = kv_cache
        self.buckets = [b for b in BUCKETS if b <= max_tokens]
        cfg, dev, dtype = model.config, model.weights.device, model.weights.dtype
        mb = max(self.buckets, default=0)
        self.ids = torch.zeros(mb, dtype=torch.long, device=dev)
        self.residual = torch.zeros(mb, cfg.hidden_size, dtype=dtype, device=dev)
        self.qkv = torch.zeros(mb, model.q_size + 2 * model.kv_size, dtype=dtype, device=dev)
        self.attn = torch.zeros(mb, model.q_size, dtype=dtype, device=dev)
        self.pool = torch.cuda.graph_pool_handle() if dev.type == "cuda" else None
        self.graphs: dict[int, list[Piece]] = {}  # bucket -> its L + 1 pieces
        self.capture_s = 0.0

    def bucket_for(self, n: int) -> int | None:
        return smallest_bucket(self.buckets, n)

    def _piece(self, j: int, b: int) -> torch.Tensor:
        """Piece j of bucket b: layer j - 1 from its attention output (the embedding for
        j = 0), then layer j up to its attention (the final add for j = L); its results
        into the static buffers."""
        m = self.model
        if j == 0:
            residual, delta = m.embed(self.ids[:b]), None
        else:
            residual, delta = m.post_attention(j - 1, self.attn[:b], self.residual[:b])
        if j < m.num_layers:
            qkv, residual = m.pre_attention(j, residual, delta)
            self.qkv[:b].copy_(qkv)
        elif delta is not None:
            residual = residual + scaled(delta)
        self.residual[:b].copy_(residual)
        return self.residual[:b]

    def capture(self) -> None:
        """Every piece of every bucket, largest bucket first."""
        t = time.perf_counter()
        pieces = list(range(self.model.num_layers + 1))
        for b in sorted(self.buckets, reverse=True):
            if self.pool is None:
                self.graphs[b] = [_Direct(lambda j=j, b=b: self._piece(j, b)) for j in pieces]
                continue
            graphs, _ = capture_buckets(self.model, pieces, self.pool, lambda j, b=b: self._piece(j, b))
            self.graphs[b] = [graphs[j] for j in pieces]
        self.capture_s = time.perf_counter() - t

    def run(self, ids: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """The final hidden states [T, hidden] of the step's T tokens (`ids` on the device;
        a view of a static buffer, valid until the next replay)."""
        n = ids.shape[0]
        b = self.bucket_for(n)
        assert b is not None, f"a step of {n} tokens has no bucket"
        m, pieces = self.model, self.graphs[b]
        self.ids[:n].copy_(ids)
        m.attn.prepare(meta)
        rot = m.ops.rotary_tables(m.rope, meta.positions)
        pieces[0].replay()
        for i in range(m.num_layers):
            m.attention(i, self.qkv[:n], rot, meta, self.kv_cache, out=self.attn[:n])
            pieces[i + 1].replay()
        return self.residual[:n]
