"""The cache folder of converted models that servers keep: each model converted once into
our format (one file per shard; servers starting together on a fresh cache wait on one lock
per model and use the first one's conversion), a borrowed tokenizer linked beside it, and
the checks that refuse a model before anything is converted."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

from blitzscale.checkpoint import load_config, resolve_model
from blitzscale.checkpoint.convert import convert
from blitzscale.checkpoint.folders import INDEX_FILE, is_native_folder
from blitzscale.checkpoint.loader import load_tokenizer_of, save_tokenizer
from blitzscale.checkpoint.native import parse_dtype
from blitzscale.core.progress import Report
from blitzscale.errors import CheckpointError
from blitzscale.model.layout import check_tp


def prepare_model(
    name: str, cache_dir: str = "", tp: int = 1, report: Report | None = None, dtype: str = ""
) -> str:
    """Our-format folder of the model (converted once and kept, one file per shard), so
    every load is one read. `report` hears how far a conversion's writes are. Random
    weights are written in `dtype` (the workers'; "": the generator's): they have no dtype
    of their own, and one stored as the workers load it is read straight into its buffer,
    with no cast (a cast of 8B fp32 weights needs 30 GB of device memory beside them)."""
    src = resolve_model(name)
    if src.kind == "native":
        return str(src.path)
    root = Path(cache_dir or os.environ.get("BLITZSCALE_CACHE", "~/.cache/blitzscale")).expanduser()
    stored = dtype if src.kind == "random" else ""
    stem = (
        name.replace(":", "_").replace("/", "_")
        + (f"_tp{tp}" if tp > 1 else "")
        + (f"_{stored}" if stored else "")
    )
    folder = root / "models" / stem
    if is_native_folder(folder):
        return str(folder)
    locks = root / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    # Servers starting together on a fresh cache convert once: the others wait for it.
    with open(locks / stem, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_native_folder(folder):
            tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
            convert(name, tmp, dtype=parse_dtype(stored) if stored else None, tp_size=tp, report=report)
            _publish(tmp, folder)
    return str(folder)


def borrowed_tokenizer(model: str, tokenizer: str) -> Any:
    """The tokenizer of `tokenizer` (a model, or a folder holding only a tokenizer, as
    `blitzscale tokenizer` writes) for `model`; refused, naming both, when there is none or
    it has more tokens than the model has logits (checked before anything is converted)."""
    tok = load_tokenizer_of(tokenizer)
    if tok is None:
        raise CheckpointError(f"tokenizer {tokenizer!r}: no tokenizer found there")
    vocab = load_config(resolve_model(model)).vocab_size
    if len(tok) > vocab:
        raise CheckpointError(
            f"tokenizer {tokenizer!r} has {len(tok)} tokens, more than the model's vocabulary of {vocab}"
        )
    return tok


def with_tokenizer(folder: str, tokenizer: str, tok: Any = None) -> str:
    """`folder` (our format) with `tokenizer`'s tokenizer (`tok`, if already loaded by
    `borrowed_tokenizer`): a folder beside it that links its weights (nothing copied) and
    holds the tokenizer's files, made once and kept."""
    tok = tok if tok is not None else borrowed_tokenizer(folder, tokenizer)
    src = Path(folder)
    # (by content: the same path holding another tokenizer later is another folder)
    backend = getattr(tok, "backend_tokenizer", None)
    content = f"{tokenizer}\n{backend.to_str() if backend is not None else ''}\n{tok.chat_template or ''}"
    key = hashlib.sha256(content.encode()).hexdigest()[:10]
    dst = src.with_name(f"{src.name}+tokenizer-{key}")
    if is_native_folder(dst):
        return str(dst)
    tmp = dst.with_name(dst.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and (f.name == INDEX_FILE or f.suffix == ".bzw"):
            (tmp / f.name).symlink_to(f.resolve())
    save_tokenizer(tok, tmp)
    _publish(tmp, dst)
    return str(dst)


def check_model_tp(name: str, tp: int) -> None:
    """Refuse, naming the values, a tp the model's shapes do not divide (before any worker
    starts, and before converting anything)."""
    if tp > 1:
        check_tp(load_config(resolve_model(name)), tp)


def _publish(tmp: Path, dst: Path) -> None:
    """`tmp`, written in full, becomes `dst` at once; if another server made `dst` first
    (one the conversion lock did not hold: NFS), its copy is kept and `tmp` dropped."""
    try:
        tmp.rename(dst)
    except OSError:
        if not is_native_folder(dst):
            raise
        shutil.rmtree(tmp)
