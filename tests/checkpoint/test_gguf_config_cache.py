"""A GGUF file's config is parsed once and kept (checkpoint/loader.py `gguf_config`): what is
kept is what the file says, a changed file is read again, and a cache that cannot be
written only costs the parse."""

from __future__ import annotations

import os
import shutil
import types
from pathlib import Path
from typing import Any

import pytest

from blitzscale.checkpoint import gguf_file, loader, native
from blitzscale.model.config import ModelConfig


def test_the_kept_config_is_the_files_and_a_changed_file_is_read_again(
    tmp_path: Path, smollm2_src: Any, smollm2_folder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = tmp_path / "model.gguf"
    shutil.copyfile(smollm2_src.path, gguf)
    monkeypatch.setenv("BLITZSCALE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(loader, "_GGUF_CONFIGS", {})
    parsed = loader.gguf_config(gguf)  # (parsed: the one real read of the file)
    # what `convert` wrote from the same file (checked against the GGUF by test_convert_roundtrip)
    assert parsed == ModelConfig.from_dict(native.read_index(Path(smollm2_folder))["config"])
    (kept,) = (tmp_path / "cache" / "configs").iterdir()

    reads: list[Path] = []

    def counting(path: Path) -> Any:
        reads.append(path)
        return types.SimpleNamespace(config=parsed)

    monkeypatch.setattr(gguf_file, "GGUFFile", counting)
    monkeypatch.setattr(loader, "_GGUF_CONFIGS", {})  # (a new process: only the file is kept)
    assert loader.gguf_config(gguf) == parsed and reads == []
    stat = gguf.stat()
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the file changed
    assert loader.gguf_config(gguf) == parsed and reads == [gguf]
    assert loader.gguf_config(gguf) == parsed and len(reads) == 1  # (then kept in the process)
    assert len(list(kept.parent.iterdir())) == 2

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("BLITZSCALE_CACHE", str(blocked / "cache"))  # (under a file: not writable)
    monkeypatch.setattr(loader, "_GGUF_CONFIGS", {})
    assert loader.gguf_config(gguf) == parsed and len(reads) == 2
