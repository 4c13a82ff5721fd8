"""BlitzScale: LLM serving whose instances scale by streaming weights GPU-to-GPU."""

__version__ = "0.1.0"
