"""CUDA graphs of the decode step, one per batch-size bucket, captured up front.

A decode step of n sequences replays the graph of the smallest bucket >= n: the forward of
every layer, the final norm and the logits, as one launch. Inputs live in one static device
buffer (token ids, positions, slots, key lengths, block tables), filled from one pinned host
buffer by one asynchronous copy; padded rows store nothing (slot -1) and attend to one key.
Capture happens when the engine is built, before any request, and does not need the weights
to have landed: the weight views and the KV cache have fixed addresses, so a live target
captures while its weights are still arriving and its first full decode pays no capture.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from blitzscale.engine.overlap import patch_pending
from blitzscale.kvcache.cache import KVCache
from blitzscale.model.attention import AttentionMetadata
from blitzscale.model.llama import LlamaModel

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
PAD_SLOT = -1


def smallest_bucket(buckets: list[int], n: int) -> int | None:
    """The smallest of the ascending `buckets` that holds `n`, or None."""
    return next((b for b in buckets if b >= n), None)


@torch.inference_mode()
def capture_buckets(
    model: LlamaModel, buckets: list[int], pool: tuple[int, int], forward: Callable[[int], torch.Tensor]
) -> tuple[dict[int, torch.cuda.CUDAGraph], dict[int, torch.Tensor]]:
    """One graph of `forward(b)` per bucket, largest first (the smaller ones reuse its pool
    memory), each after one warm-up run (Triton compiles, cuBLAS chooses); returns the graphs
    and their outputs. Nothing here waits for the whole device (`torch.cuda.graph` would
    synchronize it): a live target captures while its weight receives are in flight."""
    graphs: dict[int, torch.cuda.CUDAGraph] = {}
    outputs: dict[int, torch.Tensor] = {}
    model.check_ready = False
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    try:
        for b in sorted(buckets, reverse=True):
            side.wait_stream(main)
            with torch.cuda.stream(side):
                forward(b)
                g = torch.cuda.CUDAGraph()
                g.capture_begin(pool=pool, capture_error_mode="thread_local")
                try:
                    outputs[b] = forward(b)
                finally:
                    g.capture_end()
            main.wait_stream(side)
            graphs[b] = g
    finally:
        model.check_ready = True
    main.synchronize()
    return graphs, outputs


class BucketGraphs:
    """What the decode graphs and the one-prompt graphs (engine/prefill_graphs.py) share: a
    pinned host buffer of int64 input fields, its static device twin (the graphs' inputs),
    and one graph with its output per bucket. Fields start on multiples of `align` elements."""

    def __init__(
        self,
        model: LlamaModel,
        kv_cache: KVCache,
        max_model_len: int,
        buckets: list[int],
        sizes: dict[str, int],
        align: int = 1,
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.max_model_len = max_model_len
        self.buckets = buckets
        cuts = [n + -n % align for n in sizes.values()]
        self.host = torch.zeros(sum(cuts), dtype=torch.long, pin_memory=True)
        self.static = torch.zeros(sum(cuts), dtype=torch.long, device=model.weights.device)
        self.h = {k: v[:n] for (k, n), v in zip(sizes.items(), self.host.split(cuts), strict=True)}
        self.d = {k: v[:n] for (k, n), v in zip(sizes.items(), self.static.split(cuts), strict=True)}
        self.copied = torch.cuda.Event()
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.capture_s = 0.0  # how long `capture` took

    def bucket_for(self, n: int) -> int | None:
        return smallest_bucket(self.buckets, n)

    def _forward(self, b: int) -> torch.Tensor:
        raise NotImplementedError

    def capture(self) -> None:
        """Every bucket (the static inputs hold padding only, so the warm-up runs write
        nothing to the cache)."""
        t = time.perf_counter()
        self.graphs, self.outputs = capture_buckets(self.model, self.buckets, self.pool, self._forward)
        self.capture_s = time.perf_counter() - t

    def upload(self, blocking: bool = False) -> None:
        """The host buffer to the static inputs, in stream order; write the host buffer
        again only after `self.copied.synchronize()`."""
        self.static.copy_(self.host, non_blocking=not blocking)
        self.copied.record()


class DecodeGraphs(BucketGraphs):
    def __init__(self, model: LlamaModel, kv_cache: KVCache, max_batch: int, max_model_len: int) -> None:
        buckets = sorted({b for b in BUCKETS if b < max_batch} | {max_batch})
        mb = buckets[-1]
        self.width = -(-max_model_len // kv_cache.block_size)
        sizes = {"ids": mb, "positions": mb, "slots": mb, "seq_lens": mb, "qsl": mb + 1, "decode": mb}
        sizes["prefill"] = 0
        sizes["tables"] = mb * self.width
        super().__init__(model, kv_cache, max_model_len, buckets, sizes)
        self.rows: list[list[int]] = [[] for _ in range(mb)]  # what each host table row holds
        self.h_head = self.host[: 4 * mb]  # ids, positions, slots, seq_lens
        self.h["qsl"].copy_(torch.arange(mb + 1))
        self.h["decode"].copy_(torch.arange(mb))
        self.h["slots"].fill_(PAD_SLOT)
        self.h["seq_lens"].fill_(1)
        self.upload(blocking=True)

    def _meta(self, b: int) -> AttentionMetadata:
        d = self.d
        return AttentionMetadata(
            positions=d["positions"][:b],
            slot_mapping=d["slots"][:b],
            block_tables=d["tables"][: b * self.width].view(b, self.width),
            seq_lens=d["seq_lens"][:b],
            query_start_loc=d["qsl"][: b + 1],
            decode_seqs=d["decode"][:b],
            prefill_seqs=d["prefill"],
            query_lens=(1,) * b,
            context_lens=(self.max_model_len,) * b,
            block_size=self.kv_cache.block_size,
        )

    def _forward(self, b: int) -> torch.Tensor:
        m = self.model
        hidden = m.run_layers(m.embed(self.d["ids"][:b]), self._meta(b), self.kv_cache)
        return m.logits(hidden).float()

    def run(
        self,
        token_ids: list[int],
        context_lens: list[int],
        tables: list[list[int]],
        pending: tuple[list[int], list[int], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Float32 logits [n, vocab] of one decode token per sequence (a view of the graph's
        output: valid until the next replay). `pending` (positions, rows, device tokens):
        ids still on the device, gathered into the static input after the host copy."""
        n = len(token_ids)
        b = self.bucket_for(n)
        assert b is not None
        bs, mb, w = self.kv_cache.block_size, self.buckets[-1], self.width
        pos = [c - 1 for c in context_lens]
        slots = [t[p // bs] * bs + p % bs for t, p in zip(tables, pos, strict=True)]
        pad = [0] * (mb - n)
        # ids, positions, slots, seq_lens: adjacent in the buffer, one write for all four
        head = token_ids + pad + pos + pad + slots + [PAD_SLOT] * (mb - n) + context_lens + [1] * (mb - n)
        self.copied.synchronize()  # the last step's copy has left the host buffer
        self.h_head.copy_(torch.tensor(head))
        # Block-table rows persist between steps; only rows that changed are rewritten (a
        # new request in that row, a new block). A row is read only up to its sequence's
        # length, so stale entries past it, and the rows of padding, need no clearing.
        rows = self.h["tables"].view(mb, w)
        for i, table in enumerate(tables):
            t = table[:w]
            if self.rows[i] != t:
                rows[i, : len(t)] = torch.tensor(t)
                self.rows[i] = t
        self.upload()
        if pending is not None:
            patch_pending(self.d["ids"], *pending)
        self.graphs[b].replay()
        return self.outputs[b][:n]
