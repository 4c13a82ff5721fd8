"""Bits every subcommand shares."""

from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path

from blitzscale.errors import InvalidRequestError


def add_device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to run (default cpu)")


def check_device(device: str) -> None:
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise InvalidRequestError("--device cuda: no CUDA GPU is visible on this machine")


def quiet_libraries() -> None:
    """transformers' progress bars and warnings are noise on a CLI."""
    import os

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")


def check_out(path: str | Path, is_file: bool) -> None:
    """`--out` can be written: checked before any work, so a bad path is a one-line error
    rather than a traceback after a whole run. Its missing folders are made and removed
    again (the only sure test; nothing is left behind)."""
    p = Path(path)
    if is_file and p.is_dir():
        raise InvalidRequestError(f"--out {p}: is a folder; give a file to write")
    folder = p.parent if is_file else p
    missing = [d for d in (folder, *folder.parents) if not d.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK | os.X_OK):
            raise InvalidRequestError(f"--out {p}: the folder {folder} is not writable")
    except OSError as e:
        why = e.strerror or str(e)
        raise InvalidRequestError(f"--out {p}: cannot create the folder {folder}: {why}") from None
    finally:
        for d in missing:  # (innermost first)
            with contextlib.suppress(OSError):
                d.rmdir()
