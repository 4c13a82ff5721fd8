"""Unknown models and corrupt checkpoints fail with our errors, naming the file and problem.

Nothing corrupt may load silently, and nothing may escape as a bare KeyError / RuntimeError.
"""

from __future__ import annotations

import json
import re
import shutil
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch

from blitzscale.checkpoint import load_weights, native, resolve_model
from blitzscale.checkpoint.convert import convert
from blitzscale.engine import LLMEngine
from blitzscale.errors import CheckpointError, ModelNotFoundError

# --- unknown models ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["smollm3-1b", "llama3-8b", "SmolLM2-135M"])
def test_unknown_model_name(name: str) -> None:
    with pytest.raises(ModelNotFoundError, match=f"unknown model '{name}'") as err:
        resolve_model(name)
    assert "smollm2-135m" in str(err.value)  # says what is known


def test_unknown_random_preset() -> None:
    with pytest.raises(ModelNotFoundError, match="'random:llama9'") as err:
        resolve_model("random:llama9")
    assert "random:tiny-llama3" in str(err.value)


@pytest.mark.parametrize("spec", ["", "   "])
def test_no_model(spec: str) -> None:
    with pytest.raises(ModelNotFoundError, match="no model given"):
        resolve_model(spec)


def test_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "model.gguf"
    with pytest.raises(ModelNotFoundError, match=re.escape(str(missing))) as err:
        resolve_model(str(missing))
    assert "no such file or folder" in str(err.value)  # (not "unknown model": it is a path)


@pytest.mark.parametrize("what", ["empty-dir", "text-file", "config-only"])
def test_path_that_is_no_model(tmp_path: Path, what: str) -> None:
    path = tmp_path / "thing"
    if what == "empty-dir":
        path.mkdir()
    elif what == "text-file":
        path.write_text("hello")
    else:
        path.mkdir()
        (path / "config.json").write_text("{}")  # but no *.safetensors
    with pytest.raises(ModelNotFoundError, match=re.escape(str(path))) as err:
        resolve_model(str(path))
    assert "neither" in str(err.value)


def test_engine_from_unknown_model() -> None:
    with pytest.raises(ModelNotFoundError, match="'no-such-model'"):
        LLMEngine.from_model("no-such-model")


# --- our format --------------------------------------------------------------------------


@pytest.fixture
def native_dir(tmp_path: Path) -> Path:
    """A converted tiny llama3 (tp=1); tests corrupt their own copy."""
    convert("random:tiny-llama3", tmp_path / "native")
    return tmp_path / "native"


def load(folder: Path, tp: int = 1) -> Any:
    return load_weights(resolve_model(str(folder)), tp_size=tp)


def rank0(folder: Path) -> Path:
    return native.rank_file(folder, 0)


def test_intact_native_checkpoint_loads(native_dir: Path) -> None:
    want = load_weights(resolve_model("random:tiny-llama3"))
    assert torch.equal(load(native_dir).buffer, want.buffer)


@pytest.mark.parametrize("cut", [1, 4096, 100_000])
def test_truncated_rank_file(native_dir: Path, cut: int) -> None:
    f = rank0(native_dir)
    data = f.read_bytes()
    f.write_bytes(data[:-cut])
    with pytest.raises(
        CheckpointError, match=rf"{re.escape(str(f))}: {len(data) - cut} bytes, expected {len(data)}"
    ):
        load(native_dir)


def test_rank_file_with_trailing_bytes(native_dir: Path) -> None:
    f = rank0(native_dir)
    with open(f, "ab") as fh:
        fh.write(b"\0" * 10)
    with pytest.raises(CheckpointError, match="expected"):
        load(native_dir)


@pytest.mark.parametrize("keep", [0, 5, 20, 200])
def test_rank_file_truncated_inside_its_header(native_dir: Path, keep: int) -> None:
    f = rank0(native_dir)
    f.write_bytes(f.read_bytes()[:keep])
    with pytest.raises(CheckpointError, match=re.escape(str(f))):
        load(native_dir)


@pytest.mark.parametrize("segment", ["embed", "layer.0", "layer.3", "head"])
def test_flipped_byte_fails_the_segment_checksum(native_dir: Path, segment: str) -> None:
    f = rank0(native_dir)
    header = native.read_header(f)
    (seg,) = [s for s in header["layout"]["segments"] if s["name"] == segment]
    pos = header["data_offset"] + (seg["offset"] + seg["numel"] // 3) * header["layout"]["itemsize"]
    data = bytearray(f.read_bytes())
    data[pos] ^= 0x10
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"segment {segment} fails its checksum"):
        load(native_dir)


def test_bad_magic(native_dir: Path) -> None:
    f = rank0(native_dir)
    data = f.read_bytes()
    f.write_bytes(b"GARBAGE!" + data[8:])
    with pytest.raises(CheckpointError, match="bad magic"):
        load(native_dir)


def test_garbage_header(native_dir: Path) -> None:
    f = rank0(native_dir)
    data = bytearray(f.read_bytes())
    blob_len, _, _ = native.PREAMBLE.unpack(data[8:START])
    data[START : START + blob_len] = bytes((i * 37 + 11) % 256 for i in range(blob_len))
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt header"):
        load(native_dir)


START = len(native.MAGIC) + native.PREAMBLE.size  # where the JSON header begins


def rewrite_header(f: Path, edit: Any) -> None:
    """Replace the JSON header with `edit(header)` (with a valid header checksum), keeping
    the data where it is."""
    data = f.read_bytes()
    blob_len, data_offset, _ = native.PREAMBLE.unpack(data[8:START])
    header = json.loads(data[START : START + blob_len])
    blob = json.dumps(edit(header)).encode()
    assert START + len(blob) <= data_offset
    preamble = native.PREAMBLE.pack(len(blob), data_offset, zlib.crc32(blob))
    f.write_bytes(data[:8] + preamble + blob + data[START + len(blob) :])


@pytest.mark.parametrize("key", ["config", "dtype", "layout", "segment_crc32"])
def test_header_missing_a_field(native_dir: Path, key: str) -> None:
    f = rank0(native_dir)
    rewrite_header(f, lambda h: {k: v for k, v in h.items() if k != key})
    with pytest.raises(CheckpointError, match=re.escape(str(f))) as err:
        load(native_dir)
    assert key in str(err.value)


def test_header_with_unsupported_dtype(native_dir: Path) -> None:
    rewrite_header(rank0(native_dir), lambda h: {**h, "dtype": "float64"})
    with pytest.raises(CheckpointError, match="'float64'"):
        load(native_dir)


def test_header_layout_disagreeing_with_the_model(native_dir: Path) -> None:
    def edit(h: dict) -> dict:
        h["config"]["intermediate_size"] = 128
        return h

    rewrite_header(rank0(native_dir), edit)
    with pytest.raises(CheckpointError, match="layout does not match"):
        load(native_dir)


def test_flipped_bit_in_header_config_is_caught(native_dir: Path) -> None:
    """One flipped bit in the JSON header (rope_theta 500000.0 -> 510000.0) still parses and
    every segment checksum still passes: the header must be checked too, or the model
    silently computes something else."""
    f = rank0(native_dir)
    data = bytearray(f.read_bytes())
    pos = data.index(b'"rope_theta": 500000.0') + len(b'"rope_theta": 5')
    data[pos] ^= 0x01  # "0" -> "1"
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=re.escape(str(f))):
        load(native_dir)


def test_missing_rank_file(tmp_path: Path) -> None:
    convert("random:tiny-qwen2", tmp_path / "tp2", tp_size=2)
    rank1 = native.rank_file(tmp_path / "tp2", 1)
    rank1.unlink()
    load_weights(resolve_model(str(tmp_path / "tp2")), tp_size=2, tp_rank=0)
    with pytest.raises(CheckpointError, match=re.escape(str(rank1))):
        load_weights(resolve_model(str(tmp_path / "tp2")), tp_size=2, tp_rank=1)


@pytest.mark.parametrize("content", ["", "{not json", '{"format": "blitzscale"}', "[]"])
def test_corrupt_index_file(native_dir: Path, content: str) -> None:
    (native_dir / native.INDEX_FILE).write_text(content)
    with pytest.raises(CheckpointError, match=re.escape(native.INDEX_FILE)):
        load(native_dir)


# --- GGUF --------------------------------------------------------------------------------


@pytest.mark.parametrize("fraction", [0.0, 0.0001, 0.5, 0.9999])
def test_truncated_gguf(tmp_path: Path, smollm2_src: Any, fraction: float) -> None:
    data = smollm2_src.path.read_bytes()
    f = tmp_path / "cut.gguf"
    f.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(CheckpointError, match=re.escape(str(f))) as err:
        load_weights(resolve_model(str(f)))
    assert "GGUF" in str(err.value)


def test_garbage_gguf(tmp_path: Path) -> None:
    f = tmp_path / "junk.gguf"
    f.write_bytes(b"GGUF" + bytes(range(256)) * 40)
    with pytest.raises(CheckpointError, match=re.escape(str(f))):
        load_weights(resolve_model(str(f)))


# --- Hugging Face folders ----------------------------------------------------------------


@pytest.fixture
def hf_dir(tmp_path: Path, tiny_hf_folder) -> Path:
    return tiny_hf_folder(tmp_path / "hf", "tiny-mistral", tokenizer=False)


def edit_config(folder: Path, edit: Any) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))


@pytest.mark.parametrize(
    "field", ["hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size", "intermediate_size"]
)
def test_config_json_missing_a_field(hf_dir: Path, field: str) -> None:
    edit_config(hf_dir, lambda d: {k: v for k, v in d.items() if k != field})
    with pytest.raises(CheckpointError, match=rf"config\.json.*'{field}'"):
        load_weights(resolve_model(str(hf_dir)))


def test_config_json_not_json(hf_dir: Path) -> None:
    (hf_dir / "config.json").write_text("{ this is not json")
    with pytest.raises(CheckpointError, match=r"config\.json: cannot read"):
        load_weights(resolve_model(str(hf_dir)))


def test_config_json_unsupported_architecture(hf_dir: Path) -> None:
    edit_config(hf_dir, lambda d: {**d, "model_type": "gpt2"})
    with pytest.raises(CheckpointError, match="'gpt2'"):
        load_weights(resolve_model(str(hf_dir)))


def test_config_json_bad_head_counts(hf_dir: Path) -> None:
    edit_config(hf_dir, lambda d: {**d, "num_key_value_heads": 3})
    with pytest.raises(CheckpointError, match=r"num_heads=4.*num_kv_heads=3"):
        load_weights(resolve_model(str(hf_dir)))


def test_config_json_disagreeing_with_the_tensors(hf_dir: Path) -> None:
    """config.json says a larger MLP than the tensors hold: a checkpoint error naming the
    tensor, not a bare RuntimeError from a tensor copy."""
    edit_config(hf_dir, lambda d: {**d, "intermediate_size": 384})
    with pytest.raises(CheckpointError, match="mlp"):
        load_weights(resolve_model(str(hf_dir)))


def test_safetensors_missing_a_tensor(hf_dir: Path) -> None:
    from safetensors.torch import load_file, save_file

    f = hf_dir / "model.safetensors"
    sd = load_file(str(f))
    del sd["model.layers.1.self_attn.k_proj.weight"]
    save_file(sd, str(f), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"'model\.layers\.1\.self_attn\.k_proj\.weight'"):
        load_weights(resolve_model(str(hf_dir)))


@pytest.mark.parametrize("keep", [0, 7, 1000])
def test_truncated_safetensors(hf_dir: Path, keep: int) -> None:
    f = hf_dir / "model.safetensors"
    f.write_bytes(f.read_bytes()[:keep])
    with pytest.raises(CheckpointError, match=re.escape(str(f))):
        load_weights(resolve_model(str(hf_dir)))


def test_safetensors_truncated_in_its_data(hf_dir: Path) -> None:
    f = hf_dir / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - 4096])
    with pytest.raises(CheckpointError, match=re.escape(str(f))):
        load_weights(resolve_model(str(hf_dir)))


def test_conversion_of_a_corrupt_source_writes_no_checkpoint(hf_dir: Path, tmp_path: Path) -> None:
    edit_config(hf_dir, lambda d: {k: v for k, v in d.items() if k != "hidden_size"})
    dst = tmp_path / "out"
    with pytest.raises(CheckpointError):
        convert(str(hf_dir), dst)
    assert not (dst / native.INDEX_FILE).exists()
    shutil.rmtree(dst, ignore_errors=True)
