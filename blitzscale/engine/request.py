"""A request's parameters, its state inside the engine, and what the engine reports back."""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field

import torch

from blitzscale.errors import InvalidRequestError


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # vLLM's and OpenAI's logits processors (engine/logits.py), in the order they apply:
    min_tokens: int = 0  # EOS and stop_token_ids are held back (and stops ignored) until then
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    repetition_penalty: float = 1.0  # HF/vLLM: divides positive logits of seen tokens (prompt + output)
    frequency_penalty: float = 0.0  # OpenAI: minus penalty x count in the output
    presence_penalty: float = 0.0  # OpenAI: minus penalty once a token is in the output
    logprobs: int | None = None  # per token: its log-probability and the `logprobs` most likely

    def validate(self) -> None:
        """Refuse any value the engine cannot run or a message cannot carry, by name."""
        _check_int("max_tokens", self.max_tokens, 1, INT32_LIMIT)
        _check_float("temperature", self.temperature, 0.0, "be >= 0")
        if not 0 < self.top_p <= 1:  # also false for NaN
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        _check_int("top_k", self.top_k, -1, INT32_LIMIT, "be -1, 0 (off) or positive")
        if self.seed is not None:
            _check_int("seed", self.seed, 0, INT64_LIMIT)
        for t in self.stop_token_ids:
            _check_int("stop_token_ids", t, 0, INT32_LIMIT)
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError("stop strings must not be empty", "stop")
        self._validate_processors()

    def _validate_processors(self) -> None:
        """What the engine can run (the HTTP API checks OpenAI's narrower ranges first)."""
        _check_int("min_tokens", self.min_tokens, 0, INT32_LIMIT)
        if self.min_tokens > self.max_tokens:
            raise InvalidRequestError(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})", "min_tokens"
            )
        for token, bias in self.logit_bias:
            _check_int("logit_bias token id", token, 0, INT32_LIMIT)
            _check_float(f"logit_bias[{token}]", bias, -math.inf, "be a number")
        rp = self.repetition_penalty
        _check_float("repetition_penalty", rp, 0.0, "be > 0")
        if rp == 0:
            raise InvalidRequestError(
                "repetition_penalty must be > 0 and finite, got 0", "repetition_penalty"
            )
        _check_float("frequency_penalty", self.frequency_penalty, -math.inf, "be a number")
        _check_float("presence_penalty", self.presence_penalty, -math.inf, "be a number")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, 0, MAX_LOGPROBS + 1, f"be in [0, {MAX_LOGPROBS}]")

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0 or self.presence_penalty != 0

    @property
    def processes_logits(self) -> bool:
        """Does any logits processor change this request's logits (engine/logits.py)?"""
        return bool(self.has_penalties or self.logit_bias or self.min_tokens)

    @property
    def reads_every_step(self) -> bool:
        """Its sampling reads its own token history, or the host reads its logprobs, every
        step: it never overlaps (engine/overlap.py), so no token of it is ever pending."""
        return self.processes_logits or self.logprobs is not None

    @property
    def is_greedy(self) -> bool:
        """Temperatures below GREEDY_BELOW sample as greedy (dividing logits by them
        overflows to inf, which no distribution survives); vLLM does the same."""
        return self.temperature < GREEDY_BELOW or self.top_k == 1


GREEDY_BELOW = 1e-5
MAX_LOGPROBS = 20  # most likely tokens reported per position (vLLM's default max_logprobs)
INT32_LIMIT = 2**31  # counts and token ids
INT64_LIMIT = 2**63  # seeds (they travel as msgpack int64)


def _param(name: str) -> str:
    """The request field a check's name is about ("logit_bias[5]" -> "logit_bias")."""
    return name.split("[")[0].split(" ")[0]


def _check_int(name: str, value: object, lo: int, hi: int, must: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"{name} must be an integer, got {value!r}", _param(name))
    if value < lo:
        raise InvalidRequestError(f"{name} must {must or f'be at least {lo}'}, got {value}", _param(name))
    if value >= hi:
        raise InvalidRequestError(f"{name} must be below {hi}, got {value}", _param(name))


def _check_float(name: str, value: object, lo: float, must: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequestError(f"{name} must be a number, got {value!r}", _param(name))
    if not (math.isfinite(value) and value >= lo):
        raise InvalidRequestError(f"{name} must {must} and finite, got {value}", _param(name))


class RequestStatus(enum.Enum):
    """Where a request is in its engine (engine/table.py checks every change)."""

    WAITING = "waiting"  # in the scheduler's queue
    RUNNING = "running"  # in the running batch
    HELD = "held"  # prefilled, KV kept for migration to a decode instance
    IMPORTING = "importing"  # blocks reserved, KV migrating in from a prefill instance
    LIVE = "live"  # in a live target's layer-by-layer queue (weights still arriving)
    RELAYING = "relaying"  # a live task handed to the source, its KV [0, k) not yet sent
    RELAYED_IN = "relayed_in"  # relayed here from a live target, finishing layers [k, L)
    FINISHED = "finished"


@dataclass
class Handoff:
    """A live task crossing from a live target to its source after `layer` layers."""

    layer: int  # layers [0, layer) ran on the target (their KV travels with it)
    hidden: torch.Tensor | None = None  # residual stream after layer - 1 (None when layer == 0)
    ready: bool = False  # on the source: the hidden states and the KV have arrived


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float = field(default_factory=time.monotonic)
    token_ids: list[int] = field(init=False)  # prompt then output
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    block_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    generator: torch.Generator | None = None
    hold_kv: bool = False  # stop after the first token and keep the KV for migration
    live_layers: int = 0  # layers of its prefill run while the weights were incomplete
    handoff: Handoff | None = None  # RELAYING / RELAYED_IN: where the live task stopped
    # output processing state
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)  # of tokens not yet emitted
    num_emitted_tokens: int = 0
    num_emitted_chars: int = 0

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)
        if self.params.seed is not None:
            self.generator = torch.Generator().manual_seed(self.params.seed)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED


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
