"""Where weights come from: Hugging Face folders, GGUF files, our own format, random presets.

The names below load on first use (blitzscale/lazy.py): `resolve` and `presets` are plain,
and the simulator reads them without torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from blitzscale.lazy import exports

if TYPE_CHECKING:
    from blitzscale.checkpoint.loader import load_config, load_tokenizer, load_weights
    from blitzscale.checkpoint.resolve import ModelSource, resolve_model

_LOADER, _RESOLVE = "blitzscale.checkpoint.loader", "blitzscale.checkpoint.resolve"
__getattr__ = exports(
    __name__,
    {
        "load_config": _LOADER,
        "load_tokenizer": _LOADER,
        "load_weights": _LOADER,
        "ModelSource": _RESOLVE,
        "resolve_model": _RESOLVE,
    },
)
__all__ = ["ModelSource", "load_config", "load_tokenizer", "load_weights", "resolve_model"]
