"""One model instance: scheduler, paged KV cache, model runner, sampler, output processing."""

from blitzscale.core.config import EngineConfig
from blitzscale.core.outputs import RequestOutput
from blitzscale.core.sampling import SamplingParams
from blitzscale.engine.engine import LLMEngine

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams"]
