"""The converted copy of a model that servers keep in their cache folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from blitzscale.checkpoint import load_weights, resolve_model
from blitzscale.checkpoint.folders import is_native_folder
from blitzscale.serve import server


def test_two_servers_converting_one_model_into_a_fresh_cache_both_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_hf_folder: Any
) -> None:
    """Two servers started at once on a fresh cache both convert the model; the one that
    renames its copy second finds the folder there and uses it."""
    src = str(tiny_hf_folder(tmp_path / "hf", "tiny-llama3", tokenizer=False))
    cache = tmp_path / "cache"
    real = server.convert

    def other_server_renames_first(spec: str, dst: Path, **kw: Any) -> Path:
        out = real(spec, dst, **kw)
        final = dst.with_name(dst.name.rsplit(".tmp", 1)[0])
        real(spec, dst.with_name("other"), **kw).rename(final)
        return out

    monkeypatch.setattr(server, "convert", other_server_renames_first)
    folder = Path(server.prepare_model(src, str(cache)))
    assert is_native_folder(folder)
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]  # no copy left behind
    ours, theirs = load_weights(resolve_model(str(folder))), load_weights(resolve_model(src))
    assert torch.equal(ours.buffer, theirs.buffer)
