"""The data-plane messages a serving worker answers, dispatched in one place for the real
worker (worker/serving.py, worker/relays.py) and the simulated one (sim/engine.py).

A worker side (`DataPlaneWorker`) does one thing per message; what the router hears when
that fails is decided here, once: a request the engine refuses is Rejected, a migration that
cannot start is KVFailed, a relay whose source cannot take it is RelayFailed (its blocks go
back first), one whose peer is gone RelayLost. Torch-free: the simulator imports it.
"""

from __future__ import annotations

from typing import Protocol

from blitzscale.core.outputs import RequestOutput
from blitzscale.core.sampling import SamplingParams
from blitzscale.errors import BlitzScaleError
from blitzscale.messages import (
    AbortMsg,
    AdoptKVMsg,
    GenerateMsg,
    KVFailedMsg,
    LiveSplitMsg,
    LostMsg,
    Message,
    OutputMsg,
    RecvKVMsg,
    RejectedMsg,
    RelayFailedMsg,
    RelayInMsg,
    RelayLostMsg,
    RelayMsg,
    RequestEvent,
    ResetPrefixCacheMsg,
    SamplingMsg,
    SendKVMsg,
    SendRelayMsg,
    TokenLogprobMsg,
    sampling_fields,
)

DATA_PLANE = (
    GenerateMsg,
    AbortMsg,
    RecvKVMsg,
    SendKVMsg,
    AdoptKVMsg,
    RelayMsg,
    RelayInMsg,
    SendRelayMsg,
    ResetPrefixCacheMsg,
    LiveSplitMsg,
)


class DataPlaneWorker(Protocol):
    """One serving worker's side of the data plane: one method per message. A method
    raises BlitzScaleError for what the request cannot do here (RuntimeError: the peer of
    a point-to-point move is gone)."""

    rank: int

    @property
    def serving(self) -> bool:
        """It has an engine (messages to a worker without one are lost, not refused)."""
        ...

    def send(self, msg: Message) -> None:
        """To the router."""
        ...

    def generate(self, msg: GenerateMsg) -> None: ...

    def abort(self, request_id: str) -> None: ...

    def recv_kv(self, msg: RecvKVMsg) -> None:
        """Reserve blocks for a prefilled request, post its receive, reply KVReady."""
        ...

    def send_kv(self, msg: SendKVMsg) -> None: ...

    def adopt_kv(self, request_id: str) -> None: ...

    def relay_out(self, msg: RelayMsg) -> None:
        """A live target: hand a task over (Relayed) or say there is none (RelayNone)."""
        ...

    def relay_in(self, msg: RelayInMsg) -> None:
        """The source: reserve blocks for a relayed task, post its receives, RelayReady."""
        ...

    def send_relay(self, msg: SendRelayMsg) -> None: ...

    def cancel_relay(self, request_id: str) -> None:
        """A relay in whose receives could not be posted: its reserved blocks go back."""
        ...

    def reset_prefix_cache(self) -> None: ...

    def live_split(self, msg: LiveSplitMsg) -> None:
        """A live target: plan its queued tasks' layers (a worker not loading ignores it)."""
        ...


def dispatch(w: DataPlaneWorker, msg: Message) -> None:
    """Hand `msg` (one of DATA_PLANE) to `w`; tell the router what failed."""
    rid = getattr(msg, "request_id", "")
    if isinstance(msg, ResetPrefixCacheMsg | LiveSplitMsg):  # (no request: nothing to tell the router)
        if w.serving:
            if isinstance(msg, LiveSplitMsg):
                w.live_split(msg)
            else:
                w.reset_prefix_cache()
        return
    if not w.serving:  # not the request's fault: it can run elsewhere
        w.send(LostMsg(rank=w.rank, request_id=rid, error=f"rank {w.rank} is not serving"))
        return
    try:
        _call(w, msg)
    except BlitzScaleError as err:
        event: type[RequestEvent]
        if isinstance(msg, RelayInMsg):
            w.cancel_relay(rid)  # reserved, then its receives could not be posted
            event = RelayFailedMsg
        elif isinstance(msg, SendRelayMsg):
            event = RelayLostMsg
        elif isinstance(msg, RecvKVMsg | SendKVMsg | AdoptKVMsg):
            event = KVFailedMsg
        else:
            event = RejectedMsg
        w.send(event(rank=w.rank, request_id=rid, error=str(err)))
    except RuntimeError as err:  # torch.distributed: the peer is gone
        if isinstance(msg, RelayInMsg):
            w.cancel_relay(rid)
        event = RelayLostMsg if isinstance(msg, RelayInMsg | SendRelayMsg) else KVFailedMsg
        w.send(event(rank=w.rank, request_id=rid, error=short_error(err)))


def _call(w: DataPlaneWorker, msg: Message) -> None:
    if isinstance(msg, GenerateMsg):
        w.generate(msg)
    elif isinstance(msg, AbortMsg):
        w.abort(msg.request_id)
    elif isinstance(msg, RecvKVMsg):
        w.recv_kv(msg)
    elif isinstance(msg, SendKVMsg):
        w.send_kv(msg)
    elif isinstance(msg, AdoptKVMsg):
        w.adopt_kv(msg.request_id)
    elif isinstance(msg, RelayMsg):
        w.relay_out(msg)
    elif isinstance(msg, RelayInMsg):
        w.relay_in(msg)
    elif isinstance(msg, SendRelayMsg):
        w.send_relay(msg)


def short_error(err: BaseException) -> str:
    """The first line of a (often very long) torch.distributed error."""
    line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return line if len(line) <= 160 else line[:157] + "..."


def to_params(m: SamplingMsg) -> SamplingParams:
    return SamplingParams(**sampling_fields(m))


def output_msg(o: RequestOutput, rng_state: bytes = b"") -> OutputMsg:
    """An engine's output on the wire."""
    return OutputMsg(
        rng_state=rng_state,
        request_id=o.request_id,
        new_token_ids=list(o.new_token_ids),
        text_delta=o.text_delta,
        finished=o.finished,
        finish_reason=o.finish_reason,
        num_prompt_tokens=o.num_prompt_tokens,
        num_output_tokens=len(o.token_ids),
        live_layers=o.live_layers,
        error=o.error,
        logprobs=[TokenLogprobMsg(lp.logprob, list(lp.top)) for lp in o.logprobs],
        prompt_logprobs=[TokenLogprobMsg(lp.logprob, list(lp.top)) for lp in o.prompt_logprobs],
    )
