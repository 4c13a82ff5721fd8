"""`blitzscale tokenizer NAME DIR` writes a tokenizer folder transformers loads, no weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from blitzscale.checkpoint.resolve import hf_id
from blitzscale.cli.main import main


def test_tokenizer_folder_encodes_like_the_served_tokenizer(tmp_path: Path, smollm2_tokenizer: Any) -> None:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    dst = tmp_path / "tok"
    assert main(["tokenizer", "smollm2-135m", str(dst)]) == 0
    files = {p.name for p in dst.iterdir()}
    assert "tokenizer.json" in files
    assert not any(f.endswith((".gguf", ".safetensors", ".bin")) for f in files), files
    assert sum(p.stat().st_size for p in dst.iterdir()) < 20e6
    tok = AutoTokenizer.from_pretrained(str(dst))
    text = "Once upon a time, naïve dragons 🐉 said «bonjour»."
    assert tok(text).input_ids == smollm2_tokenizer(text).input_ids
    # the class it names is one transformers 4.x has too (lm-evaluation-harness 0.4 pins 4.x;
    # 5.x's own name for it, TokenizersBackend, fails there)
    assert (
        json.loads((dst / "tokenizer_config.json").read_text())["tokenizer_class"]
        == "PreTrainedTokenizerFast"
    )
    assert PreTrainedTokenizerFast.from_pretrained(str(dst))(text).input_ids == tok(text).input_ids
    msgs = [{"role": "user", "content": "hi"}]
    assert list(
        tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)["input_ids"]
    ) == list(
        smollm2_tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)["input_ids"]
    )


def test_a_model_without_tokenizer_is_refused_by_name(tmp_path: Path, capsys: Any) -> None:
    assert main(["tokenizer", "random:llama3-8b", str(tmp_path / "t")]) == 2
    assert "random:llama3-8b" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


def test_hf_ids() -> None:
    assert hf_id("smollm2-135m") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert hf_id("random:llama3-8b") is None
