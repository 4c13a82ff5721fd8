"""What a checkpoint folder is, by the files in it (plain: `resolve` reads it without torch)."""

from __future__ import annotations

from pathlib import Path

INDEX_FILE = "blitzscale.json"  # our format's index (checkpoint/native.py)


def is_hf_folder(path: Path) -> bool:
    """A Hugging Face folder: config.json plus .safetensors files."""
    return path.is_dir() and (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def is_native_folder(path: Path) -> bool:
    """A folder of our format (checkpoint/native.py)."""
    return path.is_dir() and (path / INDEX_FILE).is_file()
