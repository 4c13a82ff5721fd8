"""Turns a scheduler step into tensors, runs the model, and returns the rows to sample.

Inputs go to the device in one asynchronous copy from pinned memory (metadata, token ids and
the rows to sample together), so building a step never waits for the GPU. On CUDA with the
Triton backend, decode steps replay a captured graph (engine/cuda_graphs.py), and so do
steps of one prompt chunk of up to 512 tokens (engine/prefill_graphs.py); other steps of up
to 768 tokens (decode rows with prompt chunks) replay graphs piece by piece, their
attention run between the pieces (engine/mixed_graphs.py). A step with a prompt chunk whose
request asks for prompt logprobs runs eagerly: it needs every row's hidden states, where a
graph gives the last rows' logits (engine/prompt_logprobs.py).
"""

from __future__ import annotations

import os

import torch

from blitzscale.engine.cuda_graphs import DecodeGraphs
from blitzscale.engine.mixed_graphs import MixedGraphs
from blitzscale.engine.overlap import PENDING, InFlight, patch_pending
from blitzscale.engine.prefill_graphs import PrefillGraphs
from blitzscale.engine.prompt_logprobs import PromptSpan, record
from blitzscale.engine.scheduler import SchedulerOutput
from blitzscale.kvcache.cache import KVCache
from blitzscale.model.attention import AttentionMetadata
from blitzscale.model.llama import LlamaModel

# BLITZSCALE_CUDA_GRAPHS=0 runs every step eagerly (for comparisons and debugging).
GRAPHS_ENABLED = os.environ.get("BLITZSCALE_CUDA_GRAPHS", "1") != "0"


class ModelRunner:
    def __init__(
        self,
        model: LlamaModel,
        kv_cache: KVCache,
        max_num_seqs: int = 0,
        max_model_len: int = 0,
        max_num_batched_tokens: int = 0,
    ) -> None:
        """With `max_num_seqs` and `max_model_len`, decode graphs are captured now (CUDA,
        Triton backend, no tensor parallelism); with `max_num_batched_tokens` too, the graphs
        of one-prompt steps and of mixed steps."""
        self.model = model
        self.kv_cache = kv_cache
        self.device = model.weights.device
        self.graphs: DecodeGraphs | None = None
        self.prefill_graphs: PrefillGraphs | None = None
        self.mixed_graphs: MixedGraphs | None = None
        self.last_was_graph = False  # the last step replayed a captured graph
        usable = model.attn.name == "triton" and model.tp_group is None and GRAPHS_ENABLED
        if usable and max_num_seqs > 0 and max_model_len > 0:
            self.graphs = DecodeGraphs(model, kv_cache, max_num_seqs, max_model_len)
            self.graphs.capture()
            if max_num_batched_tokens > 1:
                self.prefill_graphs = PrefillGraphs(model, kv_cache, max_num_batched_tokens, max_model_len)
                self.prefill_graphs.capture()
                self.mixed_graphs = MixedGraphs(model, kv_cache, max_num_batched_tokens)
                self.mixed_graphs.capture()

    @property
    def capture_s(self) -> dict[str, float]:
        """Seconds each kind of graph took to capture."""
        kinds = {"decode": self.graphs, "prefill": self.prefill_graphs, "mixed": self.mixed_graphs}
        return {k: g.capture_s for k, g in kinds.items() if g is not None}

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, in_flight: InFlight | None = None) -> torch.Tensor:
        """Float32 logits of the requests that sample this step, in scheduled order. A
        request whose last token is PENDING takes it from `in_flight`'s device tokens. The
        prompt logprobs the step's chunks give go to their requests (`prompt_logprobs`)."""
        token_ids: list[int] = []
        query_lens, context_lens, tables, last = [], [], [], []
        dst: list[int] = []  # flat positions of pending tokens ...
        src: list[int] = []  # ... and their rows in the step in flight
        spans: list[PromptSpan] = []
        for s in out.scheduled:
            r = s.request
            start = r.num_computed_tokens
            if r.prompt_logprob_positions(start, s.num_new_tokens):
                spans.append(PromptSpan(r, len(token_ids), start, s.num_new_tokens))
            token_ids += r.token_ids[start : start + s.num_new_tokens]
            if token_ids[-1] == PENDING:
                assert in_flight is not None, f"{r.request_id!r} has a pending token but no step is in flight"
                dst.append(len(token_ids) - 1)
                src.append(in_flight.rows[r.request_id])
                token_ids[-1] = 0
            query_lens.append(s.num_new_tokens)
            context_lens.append(start + s.num_new_tokens)
            tables.append(r.block_ids)
            if s.completes_prompt:
                last.append(len(token_ids) - 1)
        pending = (dst, src, in_flight.tokens) if in_flight is not None and dst else None
        n = len(query_lens)
        if (
            self.graphs is not None
            and not spans
            and len(token_ids) == n == len(last)
            and self.graphs.bucket_for(n) is not None
        ):
            self.last_was_graph = True
            return self.graphs.run(token_ids, context_lens, tables, pending)
        pg = None if spans else self.prefill_graphs
        if pg is not None and n == 1 and len(token_ids) > 1 and pg.bucket_for(len(token_ids)) is not None:
            self.last_was_graph = True
            start = context_lens[0] - len(token_ids)
            return pg.run(token_ids, start, tables[0], bool(last), pending)
        meta, (ids, rows) = AttentionMetadata.build_with(
            query_lens, context_lens, tables, self.kv_cache.block_size, self.device, [token_ids, last]
        )
        if pending is not None:
            patch_pending(ids, *pending)
        mg = self.mixed_graphs
        self.last_was_graph = mg is not None and not spans and mg.bucket_for(len(token_ids)) is not None
        if mg is not None and self.last_was_graph:
            hidden = mg.run(ids, meta)
        else:
            hidden = self.model.run_layers(self.model.embed(ids), meta, self.kv_cache)
        if spans:
            record(self.model.logits, hidden, spans)
        return self.model.logits(hidden[rows]).float()
