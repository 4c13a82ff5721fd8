"""Bits every subcommand shares."""

from __future__ import annotations

import argparse

from blitzscale.errors import InvalidRequestError


def add_device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")


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
