"""One model instance: scheduler, paged KV cache, model runner, sampler, output processing.

The engine's bookkeeping (request table, scheduler, the hand-offs' books, the live queue's
order) is torch-free, so the simulator runs it (sim/engine.py); `LLMEngine` (torch) loads
on first use (blitzscale/lazy.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from blitzscale.core.config import EngineConfig
from blitzscale.core.outputs import RequestOutput
from blitzscale.core.sampling import SamplingParams
from blitzscale.lazy import exports

if TYPE_CHECKING:
    from blitzscale.engine.engine import LLMEngine

__getattr__ = exports(__name__, {"LLMEngine": "blitzscale.engine.engine"})
__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams"]
