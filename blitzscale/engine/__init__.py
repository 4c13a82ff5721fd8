"""One model instance: scheduler, paged KV cache, model runner, sampler, output processing."""

from blitzscale.engine.config import EngineConfig
from blitzscale.engine.engine import LLMEngine
from blitzscale.engine.request import RequestOutput, SamplingParams

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams"]
