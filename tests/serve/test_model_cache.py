"""The cache folder of converted models that servers keep (serve/model_cache.py)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from blitzscale.checkpoint import load_weights, resolve_model
from blitzscale.checkpoint.folders import is_native_folder
from blitzscale.serve import model_cache


def test_two_servers_converting_one_model_into_a_fresh_cache_both_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_hf_folder: Any
) -> None:
    """Two servers started at once on a fresh cache both convert the model; the one that
    renames its copy second finds the folder there and uses it."""
    src = str(tiny_hf_folder(tmp_path / "hf", "tiny-llama3", tokenizer=False))
    cache = tmp_path / "cache"
    real = model_cache.convert

    def other_server_renames_first(spec: str, dst: Path, **kw: Any) -> Path:
        out = real(spec, dst, **kw)
        final = dst.with_name(dst.name.rsplit(".tmp", 1)[0])
        real(spec, dst.with_name("other"), **kw).rename(final)
        return out

    monkeypatch.setattr(model_cache, "convert", other_server_renames_first)
    folder = Path(model_cache.prepare_model(src, str(cache)))
    assert is_native_folder(folder)
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]  # no copy left behind
    ours, theirs = load_weights(resolve_model(str(folder))), load_weights(resolve_model(src))
    assert torch.equal(ours.buffer, theirs.buffer)


def test_another_models_tokenizer_is_added_beside_the_weights_by_links(tmp_path: Path) -> None:
    """`[model] tokenizer` (serve --tokenizer): a folder beside the converted model links its
    weights and holds the tokenizer; the converted copy itself stays as it was."""
    from blitzscale.checkpoint import load_tokenizer
    from blitzscale.errors import CheckpointError
    from tests.conftest import byte_tokenizer

    folder = model_cache.prepare_model("random:tiny-llama3", str(tmp_path / "cache"))
    tok = byte_tokenizer()
    tok.save_pretrained(str(tmp_path / "tok"))
    with_tok = Path(model_cache.with_tokenizer(folder, str(tmp_path / "tok")))
    assert with_tok != Path(folder) and is_native_folder(with_tok)
    assert len(load_tokenizer(resolve_model(str(with_tok)))) == len(tok)
    assert load_tokenizer(resolve_model(folder)) is None  # (the cache's copy: untouched)
    assert all(f.is_symlink() for f in with_tok.glob("*.bzw"))  # (no weights copied)
    linked, converted = (load_weights(resolve_model(f)).buffer for f in (str(with_tok), folder))
    assert torch.equal(linked, converted)
    assert model_cache.with_tokenizer(folder, str(tmp_path / "tok")) == str(with_tok)  # made once
    tok.chat_template = "{{ messages[0]['content'] }}"  # the same path, another tokenizer: another folder
    tok.save_pretrained(str(tmp_path / "tok"))
    again = model_cache.with_tokenizer(folder, str(tmp_path / "tok"))
    assert again != str(with_tok) and load_tokenizer(resolve_model(again)).chat_template == tok.chat_template
    with pytest.raises(CheckpointError, match="no tokenizer found"):
        model_cache.with_tokenizer(folder, "random:tiny-llama3")
    tok.add_tokens([f"<extra{i}>" for i in range(300)])  # 558 tokens, 512 logits
    tok.save_pretrained(str(tmp_path / "big"))
    with pytest.raises(CheckpointError, match="has 558 tokens, more than the model's vocabulary of 512"):
        model_cache.with_tokenizer(folder, str(tmp_path / "big"))


def test_servers_starting_together_on_a_fresh_cache_convert_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_hf_folder: Any
) -> None:
    """The second waits for the first's conversion (a lock beside the folder) and uses it,
    instead of converting the same model again beside it."""
    src = str(tiny_hf_folder(tmp_path / "hf", "tiny-llama3", tokenizer=False))
    cache = str(tmp_path / "cache")
    real = model_cache.convert
    calls: list[str] = []
    first_in, second_called, release = threading.Event(), threading.Event(), threading.Event()

    def slow_convert(spec: str, dst: Path, **kw: Any) -> Path:
        calls.append(str(dst))
        if len(calls) == 1:
            first_in.set()
            assert release.wait(60)
        else:
            second_called.set()
        return real(spec, dst, **kw)

    monkeypatch.setattr(model_cache, "convert", slow_convert)
    folders: list[str] = []
    a = threading.Thread(target=lambda: folders.append(model_cache.prepare_model(src, cache)))
    b = threading.Thread(target=lambda: folders.append(model_cache.prepare_model(src, cache)))
    a.start()
    assert first_in.wait(60)
    b.start()
    second_called.wait(2.0)  # (without the lock the second converts now; with it, it waits)
    release.set()
    a.join(60)
    b.join(60)
    assert len(folders) == 2 and folders[0] == folders[1] and is_native_folder(Path(folders[0]))
    assert len(calls) == 1, calls
