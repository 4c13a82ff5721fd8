"""What quantizing the activations per token (FP8 e4m3, one scale a row) costs the logits,
on a real model and on random weights of its shape (issue 32; CPU, fp32).

Both sides hold the same FP8 weights (SmolLM2-135M-Instruct converted as `convert --dtype
fp8` does); one multiplies them by the activations as they are (the weight-only path: the
CPU's `DequantLinear`, the GPU's one-row GEMV), the other by the activations quantized to
e4m3 per token first (what the GPU's W8A8 paths compute: `_scaled_mm`, `w8a8_matmul`), in
fp32 so only the quantization differs. 128 tokens of the shipped evaluation text. On the
H200, random Llama-3-8B (hidden 4096) gave a logits cosine of ~0.90 between the two
(docs/benchmarks.md): its random matmuls amplify a perturbation (N(0, 0.02) weights over
4,096 inputs: a gain of ~1.3 each), where at SmolLM2's width (576 inputs: ~0.5) random
weights damp it as the real model does. Prints JSON.

Run (repo root, after `make test` has made .venv): `.venv/bin/python
docs/results/fp8_activation_quant_cosine.py`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from blitzscale.checkpoint import load_tokenizer, load_weights, resolve_model  # noqa: E402
from blitzscale.checkpoint.loader import random_weights  # noqa: E402
from blitzscale.checkpoint.pack import hf_state_dict, pack_into  # noqa: E402
from blitzscale.kvcache import KVCache  # noqa: E402
from blitzscale.model import LlamaModel  # noqa: E402
from blitzscale.model.attention import AttentionMetadata  # noqa: E402
from blitzscale.model.linear import dequantize_rows, quantize_tokens_torch  # noqa: E402
from blitzscale.model.weights import ModelWeights  # noqa: E402
from blitzscale.serve.model_cache import prepare_model  # noqa: E402

TOKENS = 128


class ActivationsQuantized:
    """The W8A8 paths' numbers in fp32: activations quantized per token, then the exact
    product of the dequantized operands."""

    name = "w8a8_fp32"

    def __call__(self, x, weight, scale, bias=None):  # type: ignore[no-untyped-def]
        xq, xs = quantize_tokens_torch(x)
        return F.linear((xq.float() * xs).to(x.dtype), dequantize_rows(weight, scale, x.dtype), bias)


@torch.inference_mode()
def logits(w: ModelWeights, ids: list[int], linear: object | None = None) -> torch.Tensor:
    model = LlamaModel(w, max_positions=512)
    if linear is not None:
        model.linear = linear
    kv = KVCache(w.config, 4, 64, torch.float32, "cpu")
    meta = AttentionMetadata.build([len(ids)], [len(ids)], [[0, 1]], 64, "cpu")
    return model.forward(torch.tensor(ids), meta, kv).float()


def fp8_of(w: ModelWeights) -> ModelWeights:
    q = ModelWeights.empty(replace(w.config, quant="fp8"), torch.float32)
    pack_into(q, hf_state_dict(w).__getitem__)
    return q


def main() -> None:
    src = resolve_model(prepare_model("smollm2-135m"))
    real = load_weights(src, dtype=torch.float32, device="cpu")
    ids = load_tokenizer(src).encode((ROOT / "tests/data/eval_text.txt").read_text())[:TOKENS]
    out = {}
    for name, w in (
        ("smollm2-135m", real),
        ("random, smollm2-135m's shape", random_weights(real.config, torch.float32, "cpu")),
    ):
        q = fp8_of(w)
        a, b = logits(q, ids), logits(q, ids, ActivationsQuantized())
        cos = F.cosine_similarity(a, b, dim=-1)
        out[name] = {
            "layers": w.config.num_layers,
            "hidden": w.config.hidden_size,
            "cosine_mean": round(float(cos.mean()), 5),
            "cosine_min": round(float(cos.min()), 5),
            "top1_agreement": round(float((a.argmax(-1) == b.argmax(-1)).float().mean()), 3),
        }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
