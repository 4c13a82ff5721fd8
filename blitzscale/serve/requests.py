"""A request's life in the router: queued -> prefill -> (migrating -> decode) -> done.

Its stage is a `Stage`, changed only through `RouterRequest.move`, which refuses a move the
stage does not allow (as the engine's request table does for its statuses).
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

from blitzscale import clock
from blitzscale.core.outputs import RequestOutput, TokenLogprob
from blitzscale.core.sampling import SamplingParams
from blitzscale.messages import OutputMsg, SamplingMsg, sampling_msg


class Stage(enum.Enum):
    QUEUED = "queued"  # in the global queue
    PREFILL = "prefill"  # sent to a prefill (or colocated) instance
    MIGRATING = "migrating"  # prefilled, its KV on its way to a decode instance
    DECODE = "decode"  # on a decode instance (or adopted by its prefill instance)
    ABORTING = "aborting"  # the client left while its KV moved: the hand-off still ends
    DONE = "done"


# stage -> the stages it may move to (staying where it is is always allowed)
STAGE_MOVES: dict[Stage, set[Stage]] = {
    Stage.QUEUED: {Stage.PREFILL, Stage.DONE},
    Stage.PREFILL: {Stage.QUEUED, Stage.MIGRATING, Stage.DONE},  # (queued: run again)
    Stage.MIGRATING: {Stage.DECODE, Stage.ABORTING, Stage.DONE},
    Stage.DECODE: {Stage.QUEUED, Stage.DONE},  # (queued: run again, its client saw nothing)
    Stage.ABORTING: {Stage.DONE},
    Stage.DONE: set(),
}


class RequestStageError(RuntimeError):
    """A router request was asked to make a move its stage does not allow (a router bug)."""


@dataclass
class RouterRequest:
    id: str
    prompt: list[int]
    params: SamplingParams
    model: str = ""  # the model it is for (the router fills in its default)
    out: asyncio.Queue[RequestOutput | Exception] = field(default_factory=asyncio.Queue)
    arrival: float = field(default_factory=clock.now)
    queued_at: float = 0.0  # when it last entered the global queue
    stage: Stage = Stage.QUEUED  # changed by `move` only
    prefill_rank: int | None = None
    decode_rank: int | None = None
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    first_token_at: float | None = None
    died_on: set[int] = field(default_factory=set)  # ranks that died while it was on them
    prefilled: bool = False  # its prompt tokens no longer count against the prefill instance
    dispatched_at: float | None = None
    migrating_since: float | None = None  # when its KV first waited for a decode instance
    rng_state: bytes = b""  # a seeded request's generator, carried from prefill to decode
    relay_from: int | None = None  # live target sending this request's prefill to prefill_rank
    live: bool = False  # part of its prefill ran on an instance still loading weights
    attempt: int = 0  # runs after the first (an instance died before it produced anything)
    prefix_hashes: list[bytes] | None = None  # its prompt's full-block hashes (prefix routing)
    stream: bool = True  # its client reads outputs as they come (False: only the whole answer)

    def move(self, new: Stage) -> None:
        if new is not self.stage and new not in STAGE_MOVES[self.stage]:
            raise RequestStageError(f"request {self.id!r}: {self.stage.value} -> {new.value}")
        self.stage = new

    @property
    def wire_id(self) -> str:
        """The id workers know this run by: a rerun is a new request to them."""
        return self.id if not self.attempt else f"{self.id}#{self.attempt}"

    @property
    def token_ids(self) -> list[int]:
        return self.prompt + self.output_ids

    def sampling_msg(self) -> SamplingMsg:
        return sampling_msg(self.params)

    @property
    def client_saw_output(self) -> bool:
        """Whether a rerun would show: it streams and has produced a token already."""
        return self.stream and self.first_token_at is not None

    def restart(self) -> RequestOutput | None:
        """Forget its output for a run from the prompt again; the output that tells the
        client's reader so (None: it had none)."""
        had = bool(self.output_ids or self.text)
        self.output_ids, self.text, self.first_token_at = [], "", None
        self.rng_state, self.migrating_since = b"", None
        if not had:
            return None
        return RequestOutput(self.id, [], [], "", "", False, None, len(self.prompt), restarted=True)

    def accept(self, o: OutputMsg, finished: bool) -> RequestOutput:
        """Fold a worker's output into the request and make the client's delta."""
        if self.first_token_at is None and o.new_token_ids:
            self.first_token_at = clock.now()
        self.output_ids += o.new_token_ids
        self.text += o.text_delta
        return RequestOutput(
            request_id=self.id,
            new_token_ids=list(o.new_token_ids),
            token_ids=list(self.output_ids),
            text_delta=o.text_delta,
            text=self.text,
            finished=finished,
            finish_reason=o.finish_reason if finished else None,
            num_prompt_tokens=len(self.prompt),
            logprobs=tuple(TokenLogprob(lp.logprob, tuple(lp.top)) for lp in o.logprobs),
            prompt_logprobs=tuple(TokenLogprob(lp.logprob, tuple(lp.top)) for lp in o.prompt_logprobs),
        )
