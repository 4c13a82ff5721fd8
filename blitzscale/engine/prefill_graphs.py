"""CUDA graphs of one-prompt steps: a single prefill chunk, padded to a token bucket.

An eager step of a few hundred prompt tokens is bound by the host on an H200: for
Llama-3-8B a 512-token chunk takes 11 ms on the device under 13-15 ms of Python and kernel
launches (161 Triton launches, 129 matmuls), so a prompt whose first 1536 tokens are cached
prefilled its last 512 in 17.9 ms against 50.1 ms for the whole 2048 (issue 31 asks 0.3x).
A step whose only work is one chunk of at most MAX_TOKENS tokens (a fresh prompt, or the
rest of one whose prefix is cached or computed) replays the graph of the smallest bucket
that holds it: every layer, the final norm and the logits of the chunk's last token, one
launch. The chunk attends through the paged prefill kernel (its prefix read from the cache,
its own keys stored first); padded tokens store nothing (slot -1) and no query past the
chunk's length is computed. Past MAX_TOKENS the device time dominates the launches, and an
eager step costs nothing a graph would save.

Inputs live in one static device buffer filled from a pinned host buffer by one
asynchronous copy, as for the decode graphs (engine/cuda_graphs.py), whose capture this
shares: before any request, without the weights (a live target captures while they arrive).
"""

from __future__ import annotations

import torch

from blitzscale.engine.cuda_graphs import PAD_SLOT, BucketGraphs
from blitzscale.engine.overlap import patch_pending
from blitzscale.kvcache.cache import KVCache
from blitzscale.model.attention import AttentionMetadata
from blitzscale.model.llama import LlamaModel

BUCKETS = (16, 32, 64, 96, 128, 192, 256, 384, 512)
MAX_TOKENS = BUCKETS[-1]
ALIGN = 2  # int64 elements in 16 bytes: each field of the buffer starts aligned


class PrefillGraphs(BucketGraphs):
    def __init__(self, model: LlamaModel, kv_cache: KVCache, max_tokens: int, max_model_len: int) -> None:
        """Buckets up to `max_tokens` (a step's prompt-token budget) and MAX_TOKENS."""
        limit = min(max_tokens, max_model_len, MAX_TOKENS)
        buckets = [b for b in BUCKETS if b <= limit]
        mb = max(buckets, default=0)
        self.width = -(-max_model_len // kv_cache.block_size)
        sizes = {"ids": mb, "positions": mb, "slots": mb, "seq_lens": 1, "qsl": 2, "prefill": 1}
        sizes |= {"decode": 0, "row": 1, "table": self.width}
        super().__init__(model, kv_cache, max_model_len, buckets, sizes, ALIGN)
        self.table: list[int] = []  # what the host table holds
        self.h["slots"].fill_(PAD_SLOT)
        self.upload(blocking=True)  # padding only: the warm-up and capture runs store nothing

    def _meta(self, b: int) -> AttentionMetadata:
        d = self.d
        return AttentionMetadata(
            positions=d["positions"][:b],
            slot_mapping=d["slots"][:b],
            block_tables=d["table"].view(1, self.width),
            seq_lens=d["seq_lens"],
            query_start_loc=d["qsl"],
            decode_seqs=d["decode"],
            prefill_seqs=d["prefill"],
            query_lens=(b,),
            # (the paged prefill kernel, never the whole-prompt path: the chunk may follow a prefix)
            context_lens=(max(b + 1, self.max_model_len),),
            block_size=self.kv_cache.block_size,
        )

    def _forward(self, b: int) -> torch.Tensor:
        m = self.model
        hidden = m.run_layers(m.embed(self.d["ids"][:b]), self._meta(b), self.kv_cache)
        return m.logits(hidden.index_select(0, self.d["row"])).float()

    def run(
        self,
        token_ids: list[int],
        start: int,
        table: list[int],
        sample: bool,
        pending: tuple[list[int], list[int], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Float32 logits [1, vocab] of the chunk's last token if `sample`, else [0, vocab]
        (a view of the graph's output: valid until the next replay). The chunk's tokens are
        the sequence's from position `start`; `table` its blocks; `pending` as for decode."""
        n = len(token_ids)
        b = self.bucket_for(n)
        assert b is not None and n > 1
        bs = self.kv_cache.block_size
        pos = torch.arange(start, start + n)
        blocks = torch.tensor(table[: -(-(start + n) // bs)], dtype=torch.long)
        self.copied.synchronize()  # the last step's copy has left the host buffer
        h = self.h
        h["ids"][:n] = torch.tensor(token_ids)
        h["positions"][:n] = pos
        h["slots"][:n] = blocks[pos // bs] * bs + pos % bs
        h["slots"][n:b] = PAD_SLOT  # (positions and ids past n: stale, harmless)
        h["seq_lens"][0] = start + n
        h["qsl"][1] = n
        h["row"][0] = n - 1
        t = table[: self.width]
        if self.table != t:
            h["table"][: len(t)] = torch.tensor(t)
            self.table = t
        self.upload()
        if pending is not None:
            patch_pending(self.d["ids"], *pending)
        self.graphs[b].replay()
        return self.outputs[b][: int(sample)]
