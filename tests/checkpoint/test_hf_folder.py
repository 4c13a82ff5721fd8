"""Hugging Face safetensors folders written by transformers load into our layout and give
transformers' logits and greedy tokens, for each architecture."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from blitzscale.checkpoint import load_config, load_weights, resolve_model
from blitzscale.checkpoint.presets import PRESETS
from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.kvcache import KVCache
from blitzscale.model import LlamaModel
from blitzscale.model.attention import AttentionMetadata


@pytest.mark.parametrize("preset", ["tiny-llama3", "tiny-mistral", "tiny-qwen2"])
def test_safetensors_folder_matches_transformers(tmp_path: Path, preset: str, tiny_hf_folder) -> None:
    import transformers

    folder = tiny_hf_folder(tmp_path / "hf", preset)
    src = resolve_model(str(folder))
    assert src.kind == "hf"
    assert load_config(src) == PRESETS[preset]  # config.json as transformers writes it
    weights = load_weights(src)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()

    ids = torch.randint(2, 512, (90,), generator=torch.Generator().manual_seed(4))
    kv = KVCache(weights.config, 8, 16, torch.float32, "cpu")
    meta = AttentionMetadata.build([90], [90], [[7, 1, 5, 0, 2, 6]], 16, "cpu")
    with torch.inference_mode():
        ours = LlamaModel(weights).forward(ids, meta, kv)
        ref = hf(ids[None]).logits[0]
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=0)

    prompt = ids[:21].tolist()
    with torch.no_grad():
        gen = hf.generate(
            ids[None, :21],
            attention_mask=torch.ones(1, 21, dtype=torch.long),
            do_sample=False,
            max_new_tokens=12,
        )
    want = gen[0, 21:].tolist()
    engine = LLMEngine.from_model(str(folder), config=EngineConfig(block_size=16, num_kv_blocks=16))
    assert engine.tokenizer is not None
    (out,) = engine.generate([prompt], SamplingParams(max_tokens=12, temperature=0))
    assert out.token_ids == want
    assert out.text == engine.tokenizer.decode(want, skip_special_tokens=True)
    assert out.text.startswith(f"w{want[0]}")  # the folder's word-level tokenizer
