"""The Llama-family forward pass as plain functions over the flat weight views.

`embed`, `run_layers(start, end)` and `logits` are separate so a caller can run any layer
range on given hidden states: live scaling splits one request's layers across instances.
Attention goes through an `AttentionBackend` (model/attention) and the pointwise work through
an ops object (model/ops.py): the SDPA reference and plain torch on CPU, Triton kernels for
bf16/fp16 on CUDA. The linear layers go through a `Linear` (model/linear.py): `F.linear`,
or for an FP8 model `torch._scaled_mm` on Hopper and dequantized weights elsewhere.
Inside a range the residual add is fused with the next RMSNorm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from blitzscale.model.attention import AttentionMetadata, select_backend
from blitzscale.model.fp8_values import Unscaled, scaled
from blitzscale.model.linear import select_linear
from blitzscale.model.ops import rms_norm, select_ops
from blitzscale.model.rope import RotaryEmbedding
from blitzscale.model.tp import TensorParallel
from blitzscale.model.weights import LayerWeights, ModelWeights

if TYPE_CHECKING:
    from blitzscale.kvcache.cache import KVCache


__all__ = ["LlamaModel", "rms_norm"]

_OPS = {"reference": "torch", "triton": "triton"}


class LlamaModel:
    def __init__(
        self,
        weights: ModelWeights,
        max_positions: int | None = None,
        tp_group: dist.ProcessGroup | TensorParallel | None = None,
        backend: str = "auto",
        ops: str | None = None,
        linear: str = "auto",
    ) -> None:
        """`backend`: "auto" (by device and dtype), "reference" (SDPA) or "triton"; `ops`
        ("auto", "torch", "triton") follows it unless given; `linear`: model/linear.py's
        `select_linear` (auto: by device, dtype and the model's quantization). `tp_group`: a
        shard's group (a `TensorParallel` also hears every layer range before it runs:
        model/tp.py)."""
        self.weights = weights
        self.tp = tp_group if isinstance(tp_group, TensorParallel) else None
        self.tp_group = tp_group.group if isinstance(tp_group, TensorParallel) else tp_group
        self.config = cfg = weights.config
        tp = weights.layout.tp_size
        if tp > 1 and tp_group is None:
            raise ValueError(f"a tensor-parallel shard (tp={tp}) needs its process group")
        if self.tp is not None and (self.tp.size, self.tp.rank) != (tp, weights.layout.tp_rank):
            raise ValueError(
                f"shard {weights.layout.tp_rank} of tp={tp} cannot run as rank {self.tp.rank} "
                f"of a group of {self.tp.size}"
            )
        self._embedded: tuple[torch.Tensor, torch.Tensor] | None = None  # (ids, hidden) for `tp`
        self.num_heads = cfg.num_heads // tp
        self.num_kv_heads = cfg.num_kv_heads // tp
        self.q_size = self.num_heads * cfg.head_dim
        self.kv_size = self.num_kv_heads * cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.rope = RotaryEmbedding(
            cfg, max_positions or cfg.max_position_embeddings, weights.dtype, weights.device
        )
        self.attn = select_backend(weights.device, weights.dtype, backend)
        self.ops = select_ops(weights.device, weights.dtype, ops or _OPS.get(backend, "auto"))
        self.linear = select_linear(weights.device, weights.dtype, cfg.quant, linear)
        self.fuse_rotary = self.attn.fuses_rotary and self.ops.name == "triton"
        # an FP8 step's qkv product left unscaled for the rotary kernel to scale as it reads
        # it (one pass over the product fewer: docs/benchmarks.md, session 32)
        self.fuse_qkv_scales = self.fuse_rotary
        self.check_ready = True  # off only while capturing CUDA graphs ahead of the weights

    @property
    def num_layers(self) -> int:
        return self.config.num_layers

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        hidden = F.embedding(token_ids, self.weights.embed)
        if self.tp is not None:  # the other shards embed the ids themselves (cheaper to send)
            self._embedded = (token_ids, hidden)
        return hidden

    def run_layers(
        self,
        hidden: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: KVCache,
        start: int = 0,
        end: int | None = None,
    ) -> torch.Tensor:
        end = self.num_layers if end is None else end
        if self.tp is not None:
            embedded, self._embedded = self._embedded, None
            ids = embedded[0] if embedded is not None and embedded[1] is hidden else None
            self.tp.on_layers(ids, hidden, meta, start, end)
        self.attn.prepare(meta)
        rot = self.ops.rotary_tables(self.rope, meta.positions)
        residual, delta = hidden, None
        for i in range(start, end):
            residual, delta = self._layer(i, residual, delta, rot, meta, kv_cache)
        return residual if delta is None else residual + scaled(delta)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        w = self.weights
        return F.linear(self.ops.rms_norm(hidden, w.norm, self.config.rms_norm_eps), w.lm_head)

    def forward(self, token_ids: torch.Tensor, meta: AttentionMetadata, kv_cache: KVCache) -> torch.Tensor:
        """Logits for every token (tests and references; the engine picks rows first)."""
        return self.logits(self.run_layers(self.embed(token_ids), meta, kv_cache))

    def _weights(self, i: int) -> LayerWeights:
        return self.weights.layer(i) if self.check_ready else self.weights.layers[i]

    def _layer(
        self,
        i: int,
        residual: torch.Tensor,
        delta: torch.Tensor | Unscaled | None,
        rot: Any,
        meta: AttentionMetadata,
        kv_cache: KVCache,
    ) -> tuple[torch.Tensor, torch.Tensor | Unscaled]:
        """Layer i on the residual stream `residual + delta` (delta: the last layer's MLP
        output, not yet added); returns the new (residual, delta)."""
        qkv, residual = self.pre_attention(i, residual, delta, raw_qkv=self.fuse_qkv_scales)
        return self.post_attention(i, self.attention(i, qkv, rot, meta, kv_cache), residual)

    def _quantized(self, rows: int) -> tuple[bool, bool]:
        """(whether a step of `rows` tokens quantizes its activations per token, whether its
        o and down products come unscaled): an FP8 step's norms and SiLU quantize, and (one
        GPU) apply the o and down products' scales as they read them."""
        quant = self.linear.takes_quantized(rows)
        return quant, quant and self.tp_group is None

    def pre_attention(
        self, i: int, residual: torch.Tensor, delta: torch.Tensor | Unscaled | None, raw_qkv: bool = False
    ) -> tuple[torch.Tensor | Unscaled, torch.Tensor]:
        """Layer i up to its attention: the input norm of `residual + delta`, then the qkv
        projection; returns (qkv [T, q + 2 kv], the residual stream). `raw_qkv`: an FP8 step's
        qkv product may come `Unscaled` (its scales applied by the attention's rotary kernel,
        `attention`; not where the step's products are scaled anyway: TP shards)."""
        w, ops = self._weights(i), self.ops
        eps = self.config.rms_norm_eps
        quant, raw = self._quantized(residual.shape[0])
        if quant:
            x, residual = ops.add_rms_norm_quant(delta, residual, w.input_norm, eps)
        elif delta is None:
            x = ops.rms_norm(residual, w.input_norm, eps)
        else:
            x, residual = ops.add_rms_norm(scaled(delta), residual, w.input_norm, eps)
        qkv = self.linear(x, w.qkv, w.qkv_scale, w.qkv_bias, raw=raw and raw_qkv)
        return (qkv if raw_qkv else scaled(qkv)), residual

    def attention(
        self,
        i: int,
        qkv: torch.Tensor | Unscaled,
        rot: Any,
        meta: AttentionMetadata,
        kv_cache: KVCache,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Layer i's attention for the step's qkv rows (their keys and values stored in the
        cache first) -> [T, q_size], into `out` where given. An `Unscaled` qkv (only where
        `fuse_qkv_scales`) has its scales applied by the backend's rotary kernel."""
        scales = None
        if isinstance(qkv, Unscaled):
            assert self.fuse_qkv_scales, "an unscaled qkv product needs the fused rotary kernel"
            qkv, scales = qkv.out, (qkv.xs, qkv.ws)
        n, d = qkv.shape[0], self.config.head_dim
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], -1)
        q = q.view(n, self.num_heads, d)
        k, v = k.view(n, self.num_kv_heads, d), v.view(n, self.num_kv_heads, d)
        dest = None if out is None else out.view(n, self.num_heads, d)
        if self.fuse_rotary:
            attn = self.attn.forward(
                q, k, v, *kv_cache.layer(i), meta, self.scale, rotary=rot, out=dest, scales=scales
            )
        else:
            q, k = self.ops.rotary(q, k, rot)
            attn = self.attn.forward(q, k, v, *kv_cache.layer(i), meta, self.scale, out=dest)
        return attn.reshape(n, self.q_size)

    def post_attention(
        self, i: int, attn: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | Unscaled]:
        """Layer i from its attention output on: the o projection, the post-attention norm
        and the MLP; returns (the residual stream, the MLP's output not yet added)."""
        w, ops, linear = self._weights(i), self.ops, self.linear
        eps = self.config.rms_norm_eps
        quant, raw = self._quantized(residual.shape[0])
        out = self._reduce(linear(attn, w.o, w.o_scale, raw=raw))
        if quant:
            x, residual = ops.add_rms_norm_quant(out, residual, w.post_norm, eps)
            act = ops.silu_mul_quant(linear(x, w.gate_up, w.gate_up_scale, raw=raw))
        else:
            x, residual = ops.add_rms_norm(scaled(out), residual, w.post_norm, eps)
            act = ops.silu_mul(scaled(linear(x, w.gate_up, w.gate_up_scale)))
        return residual, self._reduce(linear(act, w.down, w.down_scale, raw=raw))

    @torch.inference_mode()
    def warm_up_attention(self, kv_cache: KVCache) -> None:
        """Runs layer 0's attention on throwaway rows shaped like every kind of eager step
        (a decode row over one key tile and one split over several, a chunk continuing a
        prefix, a whole prompt), so that the backend compiles its kernels now and not under
        the first requests that need them (0.2-0.5 s each on an H200, stalling the step).
        Writes only into block 0, which no request holds yet; no collectives (any TP rank)."""
        if self.attn.name != "triton":
            return
        page = kv_cache.block_size
        longest = max(2, min(256, self.rope.cos.shape[0]))
        shapes = [  # (new tokens, keys) per sequence
            [(1, 1), (min(3, longest - 1), longest)],
            [(1, longest)],
            [(min(4, longest), min(4, longest)), (1, longest)],
        ]
        d = self.config.head_dim
        for seqs in shapes:
            q_lens, ctx = [q for q, _ in seqs], [c for _, c in seqs]
            tables = [[0] * -(-c // page) for c in ctx]
            meta = AttentionMetadata.build(q_lens, ctx, tables, page, self.weights.device)
            n = meta.num_tokens
            qkv = torch.randn(
                n, self.q_size + 2 * self.kv_size, dtype=self.weights.dtype, device=meta.positions.device
            )
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], -1)
            q, k, v = (
                q.view(n, self.num_heads, d),
                k.view(n, self.num_kv_heads, d),
                v.view(n, self.num_kv_heads, d),
            )
            self.attn.prepare(meta)
            rot = self.ops.rotary_tables(self.rope, meta.positions)
            if self.fuse_rotary:
                self.attn.forward(q, k, v, *kv_cache.layer(0), meta, self.scale, rotary=rot)
            else:
                self.attn.forward(*self.ops.rotary(q, k, rot), v, *kv_cache.layer(0), meta, self.scale)

    def _reduce(self, partial: torch.Tensor | Unscaled) -> torch.Tensor | Unscaled:
        """Row-parallel outputs are partial sums across TP ranks (each rank's own scales
        applied before: `_layer` asks a TP shard's linears for scaled products)."""
        if self.tp_group is not None:
            assert isinstance(partial, torch.Tensor)
            dist.all_reduce(partial, group=self.tp_group)
        return partial
