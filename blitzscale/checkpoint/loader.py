"""Load any model source into the contiguous layout on a device."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from blitzscale.checkpoint import native
from blitzscale.checkpoint.folders import INDEX_FILE
from blitzscale.checkpoint.hf import SafetensorsFolder, read_hf_config
from blitzscale.checkpoint.pack import copy_weights, hf_state_dict, pack_into
from blitzscale.checkpoint.presets import preset_config
from blitzscale.checkpoint.resolve import ModelSource, resolve_model
from blitzscale.errors import CheckpointError
from blitzscale.model.config import ModelConfig
from blitzscale.model.linear import quantize_rows
from blitzscale.model.quant import LINEAR_NAMES
from blitzscale.model.weights import ModelWeights

RANDOM_STD = 0.02
# Random weights of a tensor-parallel shard are cut from the whole model's (the same model
# at every tp) when the whole model fits in this much host memory; larger ones (benchmark
# stand-ins) draw each shard on its own.
RANDOM_WHOLE_MAX_BYTES = 4 << 30
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def load_config(src: ModelSource) -> ModelConfig:
    if src.kind == "random":
        assert src.preset is not None
        return preset_config(src.preset)
    if src.kind == "hf":
        return read_hf_config(src.path)
    if src.kind == "native":
        return ModelConfig.from_dict(native.read_index(src.path)["config"])
    return gguf_config(Path(src.path))


_GGUF_CONFIGS: dict[tuple[str, int, int], ModelConfig] = {}


def gguf_config(path: Path) -> ModelConfig:
    """A GGUF file's ModelConfig. Reading one parses all the file's metadata (SmolLM2's
    49k-token vocabulary: 6 s of a core, paid by every `serve` start's checks), so it is
    kept: once a process, and as JSON under the cache folder (`BLITZSCALE_CACHE`), keyed by
    the file's path, size and modification time (a changed file is read again)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if (hit := _GGUF_CONFIGS.get(key)) is not None:
        return hit
    root = Path(os.environ.get("BLITZSCALE_CACHE", "~/.cache/blitzscale")).expanduser() / "configs"
    kept = root / (hashlib.sha256(repr(key).encode()).hexdigest()[:32] + ".json")
    try:
        cfg = ModelConfig.from_dict(json.loads(kept.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        from blitzscale.checkpoint.gguf_file import GGUFFile  # gguf is only needed for GGUF sources

        cfg = GGUFFile(path).config
        with contextlib.suppress(OSError):  # (a cache that cannot be written is only slower)
            root.mkdir(parents=True, exist_ok=True)
            tmp = kept.with_name(f"{kept.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(cfg.to_dict()))
            os.replace(tmp, kept)
    _GGUF_CONFIGS[key] = cfg
    return cfg


def load_weights(
    src: ModelSource,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    tp_size: int = 1,
    tp_rank: int = 0,
    seed: int = 0,
    quant: str | None = None,
) -> ModelWeights:
    """`src`'s weights in the layout of `dtype` (the activation dtype) on `device`. `quant`:
    how to store the linear layers ("none", "fp8"); None keeps the source's (an FP8
    checkpoint stays FP8, its bytes as stored)."""
    cfg = load_config(src)
    if quant is not None and quant != cfg.quant:
        cfg = replace(cfg, quant=quant)
    if src.kind == "random":
        return random_weights(cfg, dtype, device, tp_size, tp_rank, seed)
    if src.kind == "native":
        return _load_native(src, cfg, dtype, device, tp_size, tp_rank)
    if src.kind == "hf":
        getter = SafetensorsFolder(src.path)
    else:
        from blitzscale.checkpoint.gguf_file import GGUFFile

        getter = GGUFFile(src.path)
    weights = ModelWeights.empty(cfg, dtype, device, tp_size, tp_rank)
    pack_into(weights, getter)
    return weights


def _load_native(
    src: ModelSource,
    cfg: ModelConfig,
    dtype: torch.dtype,
    device: torch.device | str,
    tp_size: int,
    tp_rank: int,
) -> ModelWeights:
    index = native.read_index(src.path)
    if index["tp_size"] != tp_size:
        raise CheckpointError(f"{src.path} was converted for tp={index['tp_size']}, asked for tp={tp_size}")
    stored = native.load_rank(native.rank_file(src.path, tp_rank))
    if stored.dtype == dtype and stored.config == cfg and torch.device(device).type == "cpu":
        return stored
    weights = ModelWeights.empty(cfg, dtype, device, tp_size, tp_rank)
    copy_weights(stored, weights)
    return weights


def random_weights(
    cfg: ModelConfig,
    dtype: torch.dtype,
    device: torch.device | str,
    tp_size: int = 1,
    tp_rank: int = 0,
    seed: int = 0,
) -> ModelWeights:
    """Deterministic random weights: N(0, 0.02) matrices, unit norms (a benchmark stand-in).
    A shard of a model up to RANDOM_WHOLE_MAX_BYTES is shard `tp_rank` of the tp=1 model."""
    weights = ModelWeights.empty(cfg, dtype, device, tp_size, tp_rank)
    if tp_size > 1 and weights.layout.nbytes * tp_size <= RANDOM_WHOLE_MAX_BYTES:
        whole = random_weights(cfg, dtype, "cpu", 1, 0, seed)
        pack_into(weights, hf_state_dict(whole).__getitem__)
        return weights
    fill_random(weights, seed * 1009 + tp_rank)
    weights.readiness.mark_all_ready()
    return weights


def fill_random(weights: ModelWeights, seed: int) -> None:
    """N(0, 0.02) matrices and unit norms in `weights`' buffer (readiness untouched); an FP8
    model's linears are such matrices quantized per output channel."""
    gen = torch.Generator(device=weights.device).manual_seed(seed)
    weights.buffer.normal_(0.0, RANDOM_STD, generator=gen)
    weights.zero_padding()
    for lw in weights.layers:
        lw.input_norm.fill_(1.0)
        lw.post_norm.fill_(1.0)
        if weights.config.quant == "none":
            continue
        for name in LINEAR_NAMES:
            q = getattr(lw, name)
            dense = torch.empty(q.shape, dtype=weights.dtype, device=weights.device)
            q8, scale = quantize_rows(dense.normal_(0.0, RANDOM_STD, generator=gen))
            q.copy_(q8)
            getattr(lw, name + "_scale").copy_(scale)
    weights.norm.fill_(1.0)


def load_tokenizer_of(spec: str) -> Any | None:
    """The tokenizer of `spec`: a model (name or path, as `resolve_model` takes) or a folder
    holding only a tokenizer (what `blitzscale tokenizer` writes)."""
    path = Path(spec).expanduser()
    only_tokenizer = not (path / "config.json").is_file() and not (path / INDEX_FILE).is_file()
    if path.is_dir() and only_tokenizer and any((path / f).is_file() for f in _TOKENIZER_FILES):
        return load_tokenizer(ModelSource("hf", spec, path))
    return load_tokenizer(resolve_model(spec))


# The class a saved tokenizer folder names: transformers 4.x and 5.x both load a
# tokenizer.json through it, where 5.x's own name for it (TokenizersBackend) fails on 4.x,
# which clients such as lm-evaluation-harness 0.4 still pin.
PORTABLE_TOKENIZER_CLASS = "PreTrainedTokenizerFast"


def save_tokenizer(tokenizer: Any, dst: Path) -> list[str]:
    """Write `tokenizer` as a Hugging Face folder any transformers since 4.x loads; returns
    the files written."""
    files = [str(f) for f in tokenizer.save_pretrained(str(dst))]
    config = dst / "tokenizer_config.json"
    if config.is_file():
        data = json.loads(config.read_text())
        if data.get("tokenizer_class") != PORTABLE_TOKENIZER_CLASS:
            data["tokenizer_class"] = PORTABLE_TOKENIZER_CLASS
            config.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    return files


def load_tokenizer(src: ModelSource) -> Any | None:
    """The model's tokenizer through transformers, or None for random models."""
    if src.kind == "random":
        return None
    if src.kind != "gguf" and not any((src.path / f).is_file() for f in _TOKENIZER_FILES):
        return None  # weights only (e.g. a converted random model)
    from transformers import AutoTokenizer

    try:
        if src.kind == "gguf":
            return AutoTokenizer.from_pretrained(str(src.path.parent), gguf_file=src.path.name)
        return AutoTokenizer.from_pretrained(str(src.path))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{src.name}: cannot load its tokenizer: {e}") from e
