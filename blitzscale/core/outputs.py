"""What an engine reports back for a request: its new tokens, text and log-probabilities."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's log-probability under the model (raw logits: before penalties,
    bias and temperature, as vLLM reports by default), and the most likely tokens'."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), most likely first


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    new_token_ids: list[int]  # produced since the last output of this request
    token_ids: list[int]  # every output token so far
    text_delta: str
    text: str
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error"
    num_prompt_tokens: int
    live_layers: int = 0  # layers of its prefill run while the weights were incomplete
    error: str = ""  # with finish_reason "error": why the request failed
    logprobs: tuple[TokenLogprob, ...] = ()  # one per new token, when the request asked for them
    # one per prompt token after the first (its log-probability given the tokens before it),
    # in the output that brings the first token, when the request asked for them
    prompt_logprobs: tuple[TokenLogprob, ...] = ()
    # The request runs again from its prompt (an instance died under a request whose client
    # reads only the whole answer): forget every output before this one, which has none.
    restarted: bool = False
