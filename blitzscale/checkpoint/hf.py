"""Hugging Face checkpoint folders: config.json plus one or more .safetensors files."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from blitzscale.errors import CheckpointError
from blitzscale.model.config import ModelConfig


def read_hf_config(folder: Path) -> ModelConfig:
    try:
        d = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{folder / 'config.json'}: cannot read: {e}") from e
    return ModelConfig.from_hf(d)


class SafetensorsFolder:
    """Name -> tensor over every .safetensors file in a folder (memory-mapped, lazy)."""

    def __init__(self, folder: Path) -> None:
        self._files = {}
        self._where: dict[str, str] = {}
        for f in sorted(folder.glob("*.safetensors")):
            try:
                h = safe_open(str(f), framework="pt")
            except (SafetensorError, OSError) as e:
                raise CheckpointError(f"{f}: not a readable safetensors file: {e}") from e
            self._files[f.name] = h
            for k in h.keys():  # noqa: SIM118 (safe_open is not a dict)
                self._where[k] = f.name
        if not self._files:
            raise CheckpointError(f"{folder}: no .safetensors files")

    def __call__(self, name: str) -> torch.Tensor:
        f = self._where.get(name)
        if f is None:
            raise CheckpointError(f"checkpoint has no tensor {name!r}")
        try:
            return self._files[f].get_tensor(name)
        except (SafetensorError, OSError, RuntimeError) as e:
            raise CheckpointError(f"{f}: tensor {name!r} is unreadable: {e}") from e
