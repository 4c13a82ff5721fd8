"""Package names that load on first use (PEP 562), for the packages that need torch.

`checkpoint/` and `model/` export torch-bound names (the loader, the model) beside plain
modules the control plane and the simulator read (ModelConfig, the layout, the presets,
model names): with eager re-exports, importing `blitzscale.model.config` would load torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def exports(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """`package`'s `__getattr__`: name -> the module it lives in, imported when first asked."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(home), name)

    return __getattr__
