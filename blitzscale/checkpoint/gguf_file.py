"""GGUF files (llama.cpp): metadata to ModelConfig, tensors dequantized under HF names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from blitzscale.errors import CheckpointError
from blitzscale.model.config import ModelConfig, RopeScaling

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    return None


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's interleaving of the q/k rotary halves (back to HF's rotate_half order)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class GGUFFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._reader = GGUFReader(str(path))
        except Exception as e:  # gguf raises ValueError, struct.error, IndexError...
            raise CheckpointError(f"{path}: not a readable GGUF file: {e}") from e
        self._tensors = {t.name: t for t in self._reader.tensors}
        self._by_hf_name = {hf: g for g in self._tensors if (hf := _hf_name(g)) is not None}
        self.config = self._read_config()

    def field(self, key: str, default: Any = None) -> Any:
        f = self._reader.fields.get(key)
        return default if f is None else f.contents()

    def _read_config(self) -> ModelConfig:
        arch = self.field("general.architecture")
        if arch not in ("llama", "qwen2"):
            raise CheckpointError(f"{self.path}: unsupported GGUF architecture {arch!r}")
        try:
            emb = self._tensors["token_embd.weight"]
            heads = int(self.field(f"{arch}.attention.head_count"))
            hidden = int(self.field(f"{arch}.embedding_length"))
            eos = self.field("tokenizer.ggml.eos_token_id")
            scaling = RopeScaling()
            if self.field(f"{arch}.rope.scaling.type") == "linear":
                scaling = RopeScaling(kind="linear", factor=float(self.field(f"{arch}.rope.scaling.factor")))
            if "rope_freqs.weight" in self._tensors:
                raise CheckpointError(f"{self.path}: per-frequency RoPE factors are not supported")
            return ModelConfig(
                arch=arch,
                vocab_size=int(emb.shape[1]),
                hidden_size=hidden,
                intermediate_size=int(self.field(f"{arch}.feed_forward_length")),
                num_layers=int(self.field(f"{arch}.block_count")),
                num_heads=heads,
                num_kv_heads=int(self.field(f"{arch}.attention.head_count_kv", heads)),
                head_dim=int(self.field(f"{arch}.rope.dimension_count", hidden // heads)),
                rms_norm_eps=float(self.field(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
                rope_theta=float(self.field(f"{arch}.rope.freq_base", 10000.0)),
                rope_scaling=scaling,
                max_position_embeddings=int(self.field(f"{arch}.context_length", 4096)),
                qkv_bias="blk.0.attn_q.bias" in self._tensors,
                tie_word_embeddings="output.weight" not in self._tensors,
                bos_token_id=self.field("tokenizer.ggml.bos_token_id"),
                eos_token_ids=() if eos is None else (int(eos),),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{self.path}: missing or bad GGUF metadata: {e}") from e

    def __call__(self, hf_name: str) -> torch.Tensor:
        gname = self._by_hf_name.get(hf_name)
        if gname is None:
            raise CheckpointError(f"{self.path}: no tensor for {hf_name!r}")
        t = self._tensors[gname]
        try:
            data = dequantize(t.data, t.tensor_type).reshape(tuple(reversed(t.shape.tolist())))
        except Exception as e:
            raise CheckpointError(f"{self.path}: tensor {gname!r} is unreadable: {e}") from e
        cfg = self.config
        if cfg.arch == "llama" and hf_name.endswith(("q_proj.weight", "q_proj.bias")):
            data = _unpermute(data, cfg.num_heads)
        elif cfg.arch == "llama" and hf_name.endswith(("k_proj.weight", "k_proj.bias")):
            data = _unpermute(data, cfg.num_kv_heads)
        return torch.from_numpy(np.array(data, dtype=np.float32))
