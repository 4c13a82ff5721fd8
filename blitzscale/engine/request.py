"""A request's state inside the engine (its parameters and outputs are plain data: core/).

Torch-free: the simulator's engine (sim/engine.py) keeps the same requests. A seeded
request's generator is made (and torch loaded) when something first asks for it; a
structured-output request's grammar matcher (blitzscale/structured.py) by the engine that
first samples it, from the output tokens it already has (so after a migration or a relay the
instance that samples rebuilds it).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from blitzscale.core.outputs import TokenLogprob
from blitzscale.core.sampling import SamplingParams


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
    hold_kv: bool = False  # stop after the first token and keep the KV for migration
    live_layers: int = 0  # layers of its prefill run while the weights were incomplete
    handoff: Handoff | None = None  # RELAYING / RELAYED_IN: where the live task stopped
    block_hashes: list[bytes] = field(default_factory=list)  # prefix hashes of its first full blocks
    num_registered: int = 0  # of its blocks, how many it offered the prefix cache
    cacheable: bool = True  # its blocks may enter the prefix cache (not a live task's)
    # output processing state
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)  # of tokens not yet emitted
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # computed, not yet emitted
    num_prompt_logprobs: int = 0  # prompt positions whose next token's logprob is computed
    num_emitted_tokens: int = 0
    num_emitted_chars: int = 0

    _generator: Any = field(default=None, init=False, repr=False)
    # structured output: its grammar's state (a structured.Matcher), made and advanced by the
    # engine that samples it; never sent anywhere (the receiving engine replays the tokens)
    matcher: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)

    @property
    def generator(self) -> torch.Generator | None:
        """A seeded request's own generator (None unseeded), made when first asked for."""
        if self._generator is None and self.params.seed is not None:
            import torch  # (only an engine that samples asks)

            self._generator = torch.Generator().manual_seed(self.params.seed)
        return self._generator

    def prompt_logprob_positions(self, start: int, count: int) -> range:
        """Of the positions [start, start + count) a step computes, those whose logits give
        a prompt token's logprob not recorded yet (position p predicts prompt token p + 1;
        the prompt's last position predicts the first output token, sampled as usual)."""
        if self.params.prompt_logprobs is None:
            return range(0)
        return range(max(start, self.num_prompt_logprobs), min(start + count, self.num_prompt_tokens - 1))

    @property
    def needs_prompt_logits(self) -> bool:
        """Some prompt position's logprobs are still to compute (so no cached prefix may
        stand in for its prompt)."""
        return bool(self.prompt_logprob_positions(0, self.num_prompt_tokens))

    def add_prompt_logprobs(self, first: int, logprobs: list[TokenLogprob]) -> None:
        """Record the logprobs of prompt tokens first + 1 ... (`first` must be the next
        position not recorded: positions are computed in order, and a prompt computed again
        after a preemption records nothing twice)."""
        assert first == self.num_prompt_logprobs, (first, self.num_prompt_logprobs)
        self.prompt_logprobs += logprobs
        self.num_prompt_logprobs += len(logprobs)

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
