"""Where weights come from: Hugging Face folders, GGUF files, our own format, random presets."""

from blitzscale.checkpoint.loader import load_config, load_tokenizer, load_weights
from blitzscale.checkpoint.resolve import ModelSource, resolve_model

__all__ = ["ModelSource", "load_config", "load_tokenizer", "load_weights", "resolve_model"]
