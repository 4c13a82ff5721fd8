"""The HTTP edge: OpenAI- and TGI-compatible endpoints over a serving backend."""
