"""One model instance's weights and forward pass (Llama family)."""

from blitzscale.model.config import ModelConfig
from blitzscale.model.layout import WeightLayout, build_layout
from blitzscale.model.llama import LlamaModel
from blitzscale.model.weights import ModelWeights

__all__ = ["LlamaModel", "ModelConfig", "ModelWeights", "WeightLayout", "build_layout"]
