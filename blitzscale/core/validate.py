"""The checks any front end makes on a request without an engine: its sampling values, and
its prompt against the model's vocabulary and context (the router and the engine both)."""

from __future__ import annotations

from blitzscale.core.sampling import SamplingParams
from blitzscale.errors import InvalidRequestError


def validate_request(
    prompt_token_ids: list[int], params: SamplingParams, vocab: int, max_model_len: int
) -> None:
    """Raise InvalidRequestError, naming the bad value, for a request no engine can run."""
    params.validate()
    n = len(prompt_token_ids)
    if n == 0:
        raise InvalidRequestError("prompt is empty", "prompt")
    in_range = min(prompt_token_ids) >= 0 and max(prompt_token_ids) < vocab  # (fast: long prompts)
    bad = None if in_range else next((i, t) for i, t in enumerate(prompt_token_ids) if not 0 <= t < vocab)
    if bad is not None:
        raise InvalidRequestError(
            f"prompt token {bad[1]} at position {bad[0]} is outside the vocabulary [0, {vocab})", "prompt"
        )
    if n >= max_model_len:
        raise InvalidRequestError(
            f"prompt has {n} tokens but the context is {max_model_len} tokens "
            "(prompt plus at least one generated token must fit)",
            "prompt",
        )
    bad_stop = next((t for t in params.stop_token_ids if not 0 <= t < vocab), None)
    if bad_stop is not None:
        raise InvalidRequestError(
            f"stop_token_ids token {bad_stop} is outside the vocabulary [0, {vocab})", "stop_token_ids"
        )
    bad_bias = next((t for t, _ in params.logit_bias if t >= vocab), None)
    if bad_bias is not None:
        raise InvalidRequestError(
            f"logit_bias token {bad_bias} is outside the vocabulary [0, {vocab})", "logit_bias"
        )
