"""`blitzscale convert` round trips are bit-identical.

Converting to our format and loading back gives exactly the buffer the source loads to (per
TP rank for sharded conversions), and converting our format again gives byte-identical files.
TP shards must be true slices of the unsharded model.
"""

from __future__ import annotations

import filecmp
from pathlib import Path
from typing import Any

import pytest
import torch

from blitzscale.checkpoint import load_tokenizer, load_weights, native, resolve_model
from blitzscale.checkpoint.convert import convert
from blitzscale.errors import CheckpointError
from blitzscale.model.weights import ModelWeights


def assert_same_weights(a: ModelWeights, b: ModelWeights) -> None:
    assert a.config == b.config
    assert a.layout == b.layout
    assert a.dtype == b.dtype
    assert torch.equal(a.buffer, b.buffer)
    assert b.readiness.all_ready


def assert_same_folders(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    _, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    assert not mismatch and not errors, (mismatch, errors)


def resave(src_folder: Path, dst: Path, tp: int) -> None:
    """Save a loaded native checkpoint again with the format's own writer."""
    dst.mkdir()
    src = resolve_model(str(src_folder))
    for rank in range(tp):
        w = load_weights(src, tp_size=tp, tp_rank=rank)
        native.save_rank(native.rank_file(dst, rank), w)
    native.write_index(dst, w.config, w.dtype, tp)


def test_smollm2_round_trip_is_bit_identical(tmp_path: Path, smollm2_src: Any, smollm2_folder: str) -> None:
    """The GGUF's own load equals its conversion's, bit for bit: the serve cache's folder,
    which `prepare_model` converted with `convert` and the shared fixtures load (so they
    stand for the GGUF through this test); converting that folder again changes nothing.
    (One GGUF load here: the conversion's own is the fixture's, paid once per run.)"""
    src = resolve_model(smollm2_folder)
    assert src.kind == "native"
    assert native.read_index(src.path)["tp_size"] == 1
    assert_same_weights(load_weights(smollm2_src, dtype=torch.float32), load_weights(src))

    tok, gguf_tok = load_tokenizer(src), load_tokenizer(smollm2_src)  # the tokenizer travels too
    text = "Hello, world! 🙂 <|im_start|>user"
    assert tok.encode(text) == gguf_tok.encode(text)
    assert tok.eos_token_id == gguf_tok.eos_token_id

    again = tmp_path / "again"
    convert(smollm2_folder, again)
    for name in ("rank0.bzw", native.INDEX_FILE):
        assert filecmp.cmp(src.path / name, again / name, shallow=False), name


def test_smollm2_cannot_be_split_in_two(tmp_path: Path) -> None:
    """Three kv heads do not split over two ranks: refused before anything is written."""
    with pytest.raises(CheckpointError, match=r"tp=2.*num_kv_heads=3"):
        convert("smollm2-135m", tmp_path / "x", tp_size=2)
    assert not list((tmp_path / "x").glob("*.bzw"))


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("preset", ["tiny-llama3", "tiny-qwen2"])
def test_random_preset_round_trip(tmp_path: Path, preset: str, tp: int) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    convert(f"random:{preset}", first, tp_size=tp)
    src = resolve_model(str(first))
    for rank in range(tp):
        want = load_weights(resolve_model(f"random:{preset}"), tp_size=tp, tp_rank=rank)
        assert_same_weights(want, load_weights(src, tp_size=tp, tp_rank=rank))
    resave(first, second, tp)
    assert_same_folders(first, second)


@pytest.mark.parametrize("preset", ["tiny-mistral", "tiny-qwen2"])
def test_hf_folder_tp2_shards_are_slices_of_the_whole(tmp_path: Path, preset: str, tiny_hf_folder) -> None:
    hf = tiny_hf_folder(tmp_path / "hf", preset)
    whole = load_weights(resolve_model(str(hf)))
    convert(str(hf), tmp_path / "tp2", tp_size=2)
    src = resolve_model(str(tmp_path / "tp2"))
    shards = [load_weights(src, tp_size=2, tp_rank=r) for r in range(2)]
    for r, shard in enumerate(shards):
        assert_same_weights(load_weights(resolve_model(str(hf)), tp_size=2, tp_rank=r), shard)

    cfg = whole.config
    q, kv = cfg.q_size, cfg.kv_size

    def split_qkv(t: torch.Tensor, tp: int) -> list[torch.Tensor]:
        return list(t.split([q // tp, kv // tp, kv // tp]))

    for i, full in enumerate(whole.layers):
        parts = [s.layers[i] for s in shards]
        for j, whole_part in enumerate(split_qkv(full.qkv, 1)):  # q, k, v: rows split by rank
            assert torch.equal(torch.cat([split_qkv(p.qkv, 2)[j] for p in parts]), whole_part)
        if full.qkv_bias is not None:
            for j, whole_part in enumerate(split_qkv(full.qkv_bias, 1)):
                assert torch.equal(torch.cat([split_qkv(p.qkv_bias, 2)[j] for p in parts]), whole_part)
        gate, up = full.gate_up.chunk(2)
        assert torch.equal(torch.cat([p.gate_up.chunk(2)[0] for p in parts]), gate)
        assert torch.equal(torch.cat([p.gate_up.chunk(2)[1] for p in parts]), up)
        assert torch.equal(torch.cat([p.o for p in parts], dim=1), full.o)  # columns split
        assert torch.equal(torch.cat([p.down for p in parts], dim=1), full.down)
        for p in parts:
            assert torch.equal(p.input_norm, full.input_norm)
            assert torch.equal(p.post_norm, full.post_norm)
    for s in shards:  # replicated
        assert torch.equal(s.embed, whole.embed)
        assert torch.equal(s.norm, whole.norm)
        assert torch.equal(s.lm_head, whole.lm_head)

    convert(str(tmp_path / "tp2"), tmp_path / "again", tp_size=2)
    assert_same_folders(tmp_path / "tp2", tmp_path / "again")


def test_bf16_conversion(tmp_path: Path, tiny_hf_folder) -> None:
    hf = tiny_hf_folder(tmp_path / "hf", "tiny-llama3")
    convert(str(hf), tmp_path / "bf16", dtype=torch.bfloat16)
    src = resolve_model(str(tmp_path / "bf16"))
    assert native.read_index(tmp_path / "bf16")["dtype"] == "bfloat16"
    stored = load_weights(src, dtype=torch.bfloat16)
    assert_same_weights(load_weights(resolve_model(str(hf)), dtype=torch.bfloat16), stored)
    widened = load_weights(src, dtype=torch.float32)  # cast on load, tensor by tensor
    assert widened.dtype == torch.float32
    assert torch.equal(widened.embed, stored.embed.float())
    assert torch.equal(widened.layers[2].qkv, stored.layers[2].qkv.float())
    convert(str(tmp_path / "bf16"), tmp_path / "again")
    assert_same_folders(tmp_path / "bf16", tmp_path / "again")


def test_loading_with_another_tp_is_refused(tmp_path: Path) -> None:
    convert("random:tiny-llama3", tmp_path / "tp2", tp_size=2)
    with pytest.raises(CheckpointError, match=r"tp=2.*tp=1"):
        load_weights(resolve_model(str(tmp_path / "tp2")))


@pytest.mark.parametrize("kind", ["native-from-random", "hf-without-tokenizer"])
def test_sources_without_a_tokenizer_convert_and_serve(tmp_path: Path, kind: str, tiny_hf_folder) -> None:
    """A random model converted to our format, or an HF folder with only weights, has no
    tokenizer: converting it (again) and building an engine from it must still work."""
    from blitzscale.engine import LLMEngine

    if kind == "native-from-random":
        src = tmp_path / "src"
        convert("random:tiny-qwen2", src)
    else:
        src = tiny_hf_folder(tmp_path / "src", "tiny-qwen2", tokenizer=False)
    convert(str(src), tmp_path / "dst")
    assert_same_weights(
        load_weights(resolve_model(str(src))), load_weights(resolve_model(str(tmp_path / "dst")))
    )
    assert load_tokenizer(resolve_model(str(src))) is None
    engine = LLMEngine.from_model(str(tmp_path / "dst"))
    assert engine.tokenizer is None
