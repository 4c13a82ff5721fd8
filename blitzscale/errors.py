"""Errors users see. Each names the bad value so a CLI or HTTP edge can show it as is."""


class BlitzScaleError(Exception):
    """Base of every error this package raises on purpose."""


class InvalidRequestError(BlitzScaleError, ValueError):
    """A request (prompt, sampling parameters) that can never be served; `param` names the
    request field at fault where there is one (the HTTP edge reports it)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ModelNotFoundError(BlitzScaleError, LookupError):
    """A model name or path that resolves to nothing."""


class CheckpointError(BlitzScaleError):
    """A checkpoint that exists but cannot be read (corrupt, truncated, unsupported)."""


class WeightsNotReadyError(BlitzScaleError):
    """A layer was run before its weights arrived."""


class RequestFailedError(BlitzScaleError):
    """An accepted request that could not be completed (its engine step failed, or its
    instance died after output was streamed). HTTP 500 with this message."""


class UnavailableError(BlitzScaleError):
    """Nothing can serve the request now (HTTP 503); `retry_after_s` says when to try again."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class OverloadedError(UnavailableError):
    """The queue is full, by tokens or by waiting time (HTTP 429 with Retry-After)."""


class KVIntegrityError(BlitzScaleError):
    """The KV block books of an engine do not add up (a leak or a double owner): a bug."""
