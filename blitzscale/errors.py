"""Errors users see. Each names the bad value so a CLI or HTTP edge can show it as is."""


class BlitzScaleError(Exception):
    """Base of every error this package raises on purpose."""


class InvalidRequestError(BlitzScaleError, ValueError):
    """A request (prompt, sampling parameters) that can never be served."""


class ModelNotFoundError(BlitzScaleError, LookupError):
    """A model name or path that resolves to nothing."""


class CheckpointError(BlitzScaleError):
    """A checkpoint that exists but cannot be read (corrupt, truncated, unsupported)."""


class WeightsNotReadyError(BlitzScaleError):
    """A layer was run before its weights arrived."""
