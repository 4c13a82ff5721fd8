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

    def validate(self) -> None:
        """Refuse any value the engine cannot run or a message cannot carry, by name."""
        _check_int("max_tokens", self.max_tokens, 1, INT32_LIMIT)
        _check_float("temperature", self.temperature, 0.0, "be >= 0")
        if not 0 < self.top_p <= 1:  # also false for NaN
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}")
        _check_int("top_k", self.top_k, -1, INT32_LIMIT, "be -1, 0 (off) or positive")
        if self.seed is not None:
            _check_int("seed", self.seed, 0, INT64_LIMIT)
        for t in self.stop_token_ids:
            _check_int("stop_token_ids", t, 0, INT32_LIMIT)
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError("stop strings must not be empty")

    @property
    def is_greedy(self) -> bool:
        """Temperatures below GREEDY_BELOW sample as greedy (dividing logits by them
        overflows to inf, which no distribution survives); vLLM does the same."""
        return self.temperature < GREEDY_BELOW or self.top_k == 1


GREEDY_BELOW = 1e-5
INT32_LIMIT = 2**31  # counts and token ids
INT64_LIMIT = 2**63  # seeds (they travel as msgpack int64)


def _check_int(name: str, value: object, lo: int, hi: int, must: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"{name} must be an integer, got {value!r}")
    if value < lo:
        raise InvalidRequestError(f"{name} must {must or f'be at least {lo}'}, got {value}")
    if value >= hi:
        raise InvalidRequestError(f"{name} must be below {hi}, got {value}")


def _check_float(name: str, value: object, lo: float, must: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequestError(f"{name} must be a number, got {value!r}")
    if not (math.isfinite(value) and value >= lo):
        raise InvalidRequestError(f"{name} must {must} and finite, got {value}")


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
