"""Every control message between processes, as msgspec structs with one msgpack codec.

Tensors never travel here (they go over torch.distributed); pickle never does either.
A message is a tagged struct; `encode` / `decode` are the only way onto a socket.
"""

from __future__ import annotations

import dataclasses
import hmac
from typing import Any

import msgspec

from blitzscale.control.costmodel import Profile
from blitzscale.core.config import EngineConfig
from blitzscale.core.roles import Role
from blitzscale.core.sampling import Grammar


class Msg(msgspec.Struct, tag=True, kw_only=True, frozen=True):
    """Base of all messages; the tag is the class name."""


# --- worker -> controller ------------------------------------------------------------


class HelloMsg(Msg):
    rank: int
    pid: int
    device: str
    warmup_s: float = 0.0  # connecting to every other rank at start (paid once, not per scale)
    incarnation: int = 0  # 0 at cluster start, +1 each time the rank is respawned


# --- what a command's reply carries: one result type per command ----------------------


class Result(msgspec.Struct, tag=True, kw_only=True, frozen=True):
    """Base of a reply's result; the tag is the class name."""


class NoResult(Result):
    """A command that answers nothing but done (deactivate, set role, drop a host copy)."""


class LoadResult(Result):
    """`LoadMsg`: how the weights came (`path`: "disk" or "random") and what it took."""

    path: str
    bytes: int
    seconds: float
    GBps: float = 0.0  # (our format only, as are the fields below)
    first_layer_s: float = 0.0
    direct_io: bool = False
    readers: int = 0


class TransferRankResult(Result):
    """`TransferMsg`: one rank's part, on its own wall clock (seconds since the epoch).
    `start`: its buffers were ready; `received_at`: the command reached it."""

    start: float
    received_at: float
    done_at: float
    first_layer_at: float | None = None
    bytes_received: int = 0
    bytes_sent: int = 0
    is_target: bool = False
    ready_order: list[int] = []  # segments, in the order they became ready


class HostCopyResult(Result):
    """`HostCacheMsg` (keep): the host copy's bytes, and whether its memory is pinned."""

    bytes: int
    pinned: bool
    seconds: float = 0.0  # to allocate it and copy into it (on the worker's own thread)


class ActivateResult(Result):
    """`ActivateMsg`: the engine's KV blocks and context limit; `standby`: it was the
    worker's standby engine (worker/standby.py), `engine_s`: starting it took this long."""

    num_kv_blocks: int
    max_model_len: int
    standby: bool = False
    engine_s: float = 0.0


class ReleaseResult(Result):
    """`ReleaseMsg`: bytes freed, what the device holds after, and whether the buffer (and
    engine) were kept as the worker's standby."""

    freed_bytes: int
    device_bytes_in_use: int = 0
    standby: bool = False


class ChecksumResult(Result):
    checksum: str
    dtype: str
    bytes: int


class ProfileResult(Result):
    """`ProfileMsg`: the device's name and the model's shape; with `measure`, its cost model
    on this device (`cached`: read back from the cache folder, `probe_s`: what it took)."""

    device_name: str
    weight_bytes: int
    kv_bytes_per_token: int
    num_layers: int
    profile: Profile | None = None
    cached: bool = False
    probe_s: float = 0.0
    device_memory_bytes: int = 0  # the device's whole memory (CPU: the host's; 0: unknown)
    context_len: int = 0  # the model's context (its max_position_embeddings)


class LinkResult(Result):
    """`LinkMsg` / `InstanceLinkMsg`: seconds building the link (or the group)."""

    seconds: float


class PrefixBlock(msgspec.Struct, frozen=True, array_like=True):
    """A cached KV block's place in the prefix cache (kvcache/pool.py): its prefix hash,
    its parent's (empty for a sequence's first block), and how many requests took it."""

    hash: bytes
    parent: bytes
    hits: int


class PrefixExportResult(Result):
    """`PrefixExportMsg`: the source's most reused cached blocks, parents first, packed for
    sending (`export_id` is what `PrefixSendMsg` names); none when the rank serves another
    model, caches no prefixes, or none was reused."""

    export_id: int
    blocks: list[PrefixBlock] = []
    bytes: int = 0


class PrefixMoveResult(Result):
    """`PrefixSendMsg` / `PrefixRecvMsg`: blocks sent, or registered on arrival (a prefix
    the target cached meanwhile is kept once), their bytes, the seconds on the wire."""

    blocks: int
    bytes: int
    seconds: float


ReplyResult = (
    NoResult
    | LoadResult
    | TransferRankResult
    | HostCopyResult
    | ActivateResult
    | ReleaseResult
    | ChecksumResult
    | ProfileResult
    | LinkResult
    | PrefixExportResult
    | PrefixMoveResult
)


class ReplyMsg(Msg):
    """Answer to one command; `ok=False` carries a one-line error (and `NoResult`), and
    `no_room` when it failed for want of device memory (the rank itself is fine)."""

    op_id: int
    rank: int
    ok: bool
    error: str = ""
    result: ReplyResult = NoResult()
    no_room: bool = False


# --- controller -> worker ------------------------------------------------------------


class LoadMsg(Msg):
    """Load a model locally: from disk (our format or an HF folder) or random weights."""

    op_id: int
    model: str  # the name the pool knows it by
    source: str  # a model spec: path, name, random:...
    tp_size: int = 1
    tp_rank: int = 0
    parallel_readers: int = 8
    direct_io: bool = False  # O_DIRECT reads (bypass the page cache) where possible
    max_bytes_per_s: float = 0.0  # cap the read rate (0: none), to reproduce a slower disk


class TransferMsg(Msg):
    """One rank's part of a weight transfer; every participant gets the same plan."""

    op_id: int
    model: str
    source: str  # spec of the model, so a target can size its buffer
    chains: list[list[int]]  # chains[j] = [source rank, target ranks...] carrying stripe j
    num_stripes: int
    dtype: str = "float32"
    piece_bytes: int = 0  # 0: one piece per segment stripe
    host_source: bool = False  # chain heads send from their pinned host copy
    head_is_target: bool = False  # with host_source: the head also loads the model itself
    max_bytes_per_s: float = 0.0  # 0: no cap (a cap reproduces slow links)
    timeout_s: float = 60.0
    tp_size: int = 1
    tp_rank: int = 0


class HostCacheMsg(Msg):
    """Keep (or drop) this rank's pinned host copy of a model it holds on its device."""

    op_id: int
    model: str
    keep: bool = True


class ReleaseMsg(Msg):
    op_id: int
    model: str
    host_copy: bool = False  # also drop the host copy


class ChecksumMsg(Msg):
    op_id: int
    model: str
    host_copy: bool = False


class ProfileMsg(Msg):
    """Measure (or read back from `cache_dir`) the cost model of `model` served with
    `engine` on this rank's device (worker/costprobe.py); `measure=False` only names the
    device. The reply's result: a `ProfileResult`."""

    op_id: int
    model: str
    source: str  # where its config comes from
    engine: EngineConfig
    cache_dir: str = ""  # "" = don't keep it
    measure: bool = True
    # > 1: of a tensor-parallel instance: the sizes are one shard's, and the measurement
    # runs on the instance group this rank leads (its other shards follow the steps)
    tp: int = 1


class PrefixExportMsg(Msg):
    """To a serving source of `model`: pack up to `max_blocks` of its most reused cached
    prefix blocks (hot prefixes travel with the weights to a new instance)."""

    op_id: int
    model: str
    max_blocks: int


class PrefixSendMsg(Msg):
    """To the source: send the packed blocks of export `export_id` to `dst_rank` over the
    KV link, then drop them; replies when they are on the wire's far side."""

    op_id: int
    export_id: int
    dst_rank: int


class PrefixRecvMsg(Msg):
    """To the new instance serving `model`: receive these blocks from `src_rank` into free
    KV blocks and register them as cached; replies when they landed."""

    op_id: int
    model: str
    src_rank: int
    blocks: list[PrefixBlock]


class ShutdownMsg(Msg):
    op_id: int = 0


class StandbyMsg(Msg):
    """Build the standby engine again as `engine` (the models resident per rank, derived
    once the workers said their device's memory, size its KV cache's share)."""

    op_id: int
    engine: EngineConfig


class ActivateMsg(Msg):
    """Start serving a model this rank holds, in a role ("prefill", "decode", "colocated")."""

    op_id: int
    model: str
    source: str  # model spec, for its tokenizer
    role: Role
    engine: EngineConfig  # the `[engine]` section the server was configured with
    live: bool = False  # a live target: serve while the weights are still arriving (ZigZag)
    pace: Profile | None = None  # `[engine] pace` resolved: each step lasts what it gives
    slot: int = 0  # which of the worker's resident models' loops serves it


class DeactivateMsg(Msg):
    """Stop serving (the engine must have no requests left); the weights stay."""

    op_id: int
    slot: int = 0


class SetRoleMsg(Msg):
    """A prefill instance mutating to decode (or back); the engine and its KV stay."""

    op_id: int
    role: Role
    slot: int = 0


class LinkMsg(Msg):
    """`peer` was respawned: build this rank's link to its new incarnation (worker/world.py);
    the reply comes once one message has gone both ways on it. With `plane`: rebuild only
    that plane of the link to a live `peer` (a failed transfer broke it), under a
    `generation` both ends are given."""

    op_id: int
    peer: int
    incarnation: int
    plane: str = ""
    generation: int = 0


class InstanceLinkMsg(Msg):
    """Every member of a tensor-parallel rank group is alive again (one was respawned):
    build the group's process groups among these incarnations (rank -> incarnation)."""

    op_id: int
    incarnations: dict[int, int]


# --- data plane: router <-> serving workers (a socket of its own) ---------------------


class GrammarMsg(msgspec.Struct, frozen=True, array_like=True):
    """`blitzscale.core.sampling.Grammar` on the wire (structured output)."""

    kind: str
    schema: str = ""


class SamplingMsg(Msg):
    """`blitzscale.core.sampling.SamplingParams` on the wire (same field names)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = []
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    min_tokens: int = 0
    logit_bias: list[tuple[int, float]] = []
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    grammar: GrammarMsg | None = None  # structured output (the decoding side rebuilds its state)


def sampling_msg(params: Any) -> SamplingMsg:
    """A SamplingParams dataclass as its message (tuples become lists). Its fields are read
    one by one (all immutable): `dataclasses.asdict` deep-copies them, 44 against 8 us a
    call, at every dispatch and relay (docs/results/sampling_msg_cost.py)."""
    fields = {
        f.name: list(v) if isinstance(v := getattr(params, f.name), tuple) else v
        for f in dataclasses.fields(params)
    }
    g = params.grammar
    fields["grammar"] = None if g is None else GrammarMsg(g.kind, g.schema)
    return SamplingMsg(**fields)


def sampling_fields(m: SamplingMsg) -> dict[str, Any]:
    """The message's fields, ready for SamplingParams(**...) (lists become tuples)."""
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in msgspec.structs.asdict(m).items()}
    g = m.grammar
    fields["grammar"] = None if g is None else Grammar(g.kind, g.schema)
    return fields


class GenerateMsg(Msg):
    """Run a request; with `hold_kv` stop after the first token and keep the KV to migrate."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingMsg
    hold_kv: bool = False


class AbortMsg(Msg):
    request_id: str


class ResetPrefixCacheMsg(Msg):
    """Forget the engine's cached prefixes (`POST /reset_prefix_cache`); no reply."""


class RecvKVMsg(Msg):
    """Decode side: allocate blocks for a prefilled request and receive its KV from `src`."""

    request_id: str
    src_rank: int
    token_ids: list[int]
    num_prompt_tokens: int
    num_emitted_chars: int
    params: SamplingMsg
    rng_state: bytes = b""  # the seeded generator's state, so sampling continues unchanged


class SendKVMsg(Msg):
    """Prefill side: send a held request's KV to `dst` (which has allocated), then free it."""

    request_id: str
    dst_rank: int


class AdoptKVMsg(Msg):
    """To a prefill instance turning into a decode one: decode, here, a request it holds
    (its KV is already in place, so it needs no migration)."""

    request_id: str


class RelayMsg(Msg):
    """To a live target: hand a task (the head while loading) to its source `dst_rank`."""

    dst_rank: int


class LiveSplitMsg(Msg):
    """To a live target: the router's split of its queued tasks (control/live_split.py),
    by request id: the layers each runs here while weights arrive before its partner takes
    it (the model's layer count: all of it here). Tasks it does not name keep the greedy
    rule; a later split replaces this one."""

    layers: dict[str, int]


class RelayedMsg(Msg):
    """From a live target: `request_id` stopped after `layer` layers and waits to be sent."""

    rank: int
    request_id: str
    layer: int
    live_layers: int  # of those, layers run while the weights were incomplete


class RelayInMsg(Msg):
    """To the source: reserve blocks for a relayed prompt and receive, from `src_rank`, its
    hidden states after `layer` layers and the KV of layers [0, layer); then finish it."""

    request_id: str
    src_rank: int
    layer: int
    prompt_token_ids: list[int]
    params: SamplingMsg
    hold_kv: bool = False


class SendRelayMsg(Msg):
    """To the live target: send a relayed task to `dst_rank` (it is ready), or with
    `dst_rank` -1 take the task back (the source could not take it)."""

    request_id: str
    dst_rank: int


class TokenLogprobMsg(msgspec.Struct, frozen=True, array_like=True):
    """`blitzscale.core.outputs.TokenLogprob` on the wire."""

    logprob: float
    top: list[tuple[int, float]] = []


class OutputMsg(Msg):
    request_id: str
    new_token_ids: list[int]
    text_delta: str
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    rng_state: bytes = b""  # with finish_reason "migrate": the request's generator state
    live_layers: int = 0  # layers of its prefill run on an instance still loading weights
    error: str = ""  # with finish_reason "error": why it failed (it is not run again)
    logprobs: list[TokenLogprobMsg] = []  # one per new token, when the request asked for them
    # one per prompt token after the first, in the output that brings the first token (when
    # the request asked for them)
    prompt_logprobs: list[TokenLogprobMsg] = []


class OutputsMsg(Msg):
    rank: int
    outputs: list[OutputMsg]


class RequestEvent(Msg):
    """Base of the data-plane events about one request (not sent as itself)."""

    rank: int
    request_id: str
    error: str = ""


class KVReadyMsg(RequestEvent):
    """Decode side: the receive for the request's KV is posted (the prefill side may send)."""


class KVSentMsg(RequestEvent):
    """Prefill side: the KV has gone; its blocks are free here."""


class KVFailedMsg(RequestEvent):
    """A KV hand-off could not start or complete on this side (`error` says why)."""


class RejectedMsg(RequestEvent):
    """The worker refused the request itself (a bad request: 400)."""


class LostMsg(RequestEvent):
    """This instance lost the request before producing anything (not the request's fault):
    the router may run it again elsewhere."""


class RelayReadyMsg(RequestEvent):
    """Live source: the receives for a relayed task are posted (the target may send)."""


class RelaySentMsg(RequestEvent):
    """Live target: the relayed task's hidden states and KV have gone."""


class RelayFailedMsg(RequestEvent):
    """Live source: no room for the relayed task; the target keeps it."""


class RelayLostMsg(RequestEvent):
    """A relay broke on the wire (a side died): the request is lost."""


RelayEvent = RelayReadyMsg | RelaySentMsg | RelayFailedMsg | RelayLostMsg
RELAY_EVENTS = (RelayReadyMsg, RelaySentMsg, RelayFailedMsg, RelayLostMsg)


class RelayNoneMsg(Msg):
    """Live target: asked for a task to relay, it had none."""

    rank: int


class LiveEvent(Msg):
    """Base of a live target's progress events (not sent as itself)."""

    rank: int
    error: str = ""


class LiveReadyMsg(LiveEvent):
    """The first layers have landed: the target can take prompts. `loaded_in_s`: when its
    last layer should land, in seconds from now, at the rate its first ones came (0:
    unknown)."""

    loaded_in_s: float = 0.0


class LiveLoadedMsg(LiveEvent):
    """Every layer has landed."""


class LiveDoneMsg(LiveEvent):
    """Its live queue is drained: it serves as a normal instance from here."""


class LiveFailedMsg(LiveEvent):
    """Its weights will not all arrive: it serves no more."""


class StepKindMsg(msgspec.Struct, frozen=True, array_like=True):
    """Engine steps of one kind (engine/work.py STEP_KINDS) over a worker's life: how many,
    seconds inside them, how many overlapped the step before, tokens they computed."""

    kind: str
    steps: int
    seconds: float
    overlapped: int
    tokens: int


class StatsMsg(Msg):
    rank: int
    num_running: int
    num_waiting: int
    num_held: int
    used_blocks: int
    total_blocks: int
    num_live: int = 0  # tasks in a live target's queue
    # Where the worker's time goes (cumulative since it started): engine steps run, seconds
    # inside them (with overlap: launch, sampling and the wait for the step before), and
    # seconds of its loop while it had work (steps plus messages, polling, outputs).
    num_steps: int = 0
    step_s: float = 0.0
    busy_s: float = 0.0
    # paced steps so far (worker/pacing.py; this worker's life): how many, how many took
    # longer than their reference, their real compute and their paced length, seconds
    paced_steps: int = 0
    paced_over: int = 0
    paced_real_s: float = 0.0
    paced_s: float = 0.0
    step_kinds: list[StepKindMsg] = []  # the steps above, by kind (those that ran)
    # prefix cache (this engine's life): prompt tokens looked up, and found there
    prefix_queries: int = 0
    prefix_hits: int = 0
    # engine steps that ran out of device memory and were retried smaller (engine/oom.py)
    oom_retries: int = 0
    kv_cache_bytes: int = 0  # device bytes its KV cache holds (a TP shard's: its own)


Message = (
    HelloMsg
    | ReplyMsg
    | LoadMsg
    | TransferMsg
    | HostCacheMsg
    | ReleaseMsg
    | ChecksumMsg
    | ProfileMsg
    | PrefixExportMsg
    | PrefixSendMsg
    | PrefixRecvMsg
    | ShutdownMsg
    | StandbyMsg
    | ActivateMsg
    | DeactivateMsg
    | SetRoleMsg
    | LinkMsg
    | InstanceLinkMsg
    | GenerateMsg
    | AbortMsg
    | ResetPrefixCacheMsg
    | RecvKVMsg
    | SendKVMsg
    | AdoptKVMsg
    | RelayMsg
    | LiveSplitMsg
    | RelayedMsg
    | RelayInMsg
    | SendRelayMsg
    | OutputsMsg
    | KVReadyMsg
    | KVSentMsg
    | KVFailedMsg
    | RejectedMsg
    | LostMsg
    | RelayReadyMsg
    | RelaySentMsg
    | RelayFailedMsg
    | RelayLostMsg
    | RelayNoneMsg
    | LiveReadyMsg
    | LiveLoadedMsg
    | LiveDoneMsg
    | LiveFailedMsg
    | StatsMsg
)

# --- a tensor-parallel instance: its leader (shard 0) -> its other shards --------------
# These go over the instance's own control group (worker/tp.py), never a socket: the
# leader runs the engine, the other shards run what it says, in the order it says it.


class TPSetupMsg(Msg):
    """Serve `model` as a follower of this instance: a KV cache of the leader's size.
    `live`: the weights are still arriving (a live target), so the shard serves the
    segments that have landed; its own transfer may start just after this reaches it."""

    model: str
    num_blocks: int
    block_size: int
    max_model_len: int
    live: bool = False
    # not "": no weights have arrived; the shard builds stand-in weights of the model whose
    # config is at this path (the cost probe of a tensor-parallel instance, worker/cost_report.py)
    stand_in_source: str = ""


class TPReadyMsg(Msg):
    """A live target's leader asks how many leading weight segments every shard has: each
    answers its own count in a MIN all-reduce on the compute group."""


class TPForwardMsg(Msg):
    """Run layers [start, end) of one step: on the embedding of `token_ids` (int64 bytes),
    or on `hidden` (bytes of `dtype`, [tokens, hidden size]) when no ids are given.
    `meta`: the step's AttentionMetadata tensors as int64 bytes, cut by `meta_sizes`."""

    start: int
    end: int
    meta: bytes
    meta_sizes: list[int]
    num_seqs: int
    query_lens: list[int]
    context_lens: list[int]
    block_size: int
    token_ids: bytes = b""
    hidden: bytes = b""
    dtype: str = ""


class TPKVSendMsg(Msg):
    """Send these blocks' KV (this shard's heads) to the same shard of the instance led by
    `dst_rank`. `num_layers`: only layers [0, num_layers) (a relay); 0: every layer."""

    request_id: str
    block_ids: list[int]
    dst_rank: int
    num_layers: int = 0


class TPKVRecvMsg(Msg):
    """Post a receive for `num_blocks` blocks of KV from the same shard of the instance led
    by `src_rank`."""

    request_id: str
    num_blocks: int
    src_rank: int
    num_layers: int = 0  # as in TPKVSendMsg


class TPKVCommitMsg(Msg):
    """The leader's receive landed: wait for this shard's, put it in `block_ids`, and say in
    the group's all-reduce whether it landed (1) or not (0)."""

    request_id: str
    block_ids: list[int]
    num_layers: int = 0  # as in TPKVSendMsg


class TPKVDropMsg(Msg):
    """The request's import was cancelled: whatever arrives for it is discarded."""

    request_id: str


class TPStopMsg(Msg):
    """The leader stopped serving: drop the KV cache and the model (the weights stay)."""


TPCommand = (
    TPSetupMsg
    | TPReadyMsg
    | TPForwardMsg
    | TPKVSendMsg
    | TPKVRecvMsg
    | TPKVCommitMsg
    | TPKVDropMsg
    | TPStopMsg
)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)
_tp_decoder = msgspec.msgpack.Decoder(TPCommand)


def encode(msg: Message | TPCommand) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes) -> Message:
    return _decoder.decode(data)


def decode_tp(data: bytes) -> TPCommand:
    return _tp_decoder.decode(data)


# --- framing on the listening (ROUTER) sockets ------------------------------------------
# Anything on this host can connect to a listening socket, so every frame a worker sends
# carries the cluster's secret token (handed to the workers when they are spawned, never
# over a socket); the router and the controller drop any frame without it, and log it.


class FrameError(ValueError):
    """A frame that is not a message from this cluster's workers (dropped, never fatal)."""


def worker_frames(token: bytes, msg: Message) -> list[bytes]:
    """What a worker sends: [token, message]."""
    return [token, encode(msg)]


def open_frames(frames: list[bytes], token: bytes) -> Message:
    """[identity, token, message] as a ROUTER socket receives it -> the message."""
    if len(frames) != 3:
        raise FrameError(f"{len(frames)} frames where 3 belong")
    if not hmac.compare_digest(frames[1], token):
        raise FrameError("no valid cluster token")
    try:
        return decode(frames[2])
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise FrameError(f"undecodable message: {e}") from e
