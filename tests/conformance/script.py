"""One scripted conversation with two serving workers (rank 0, rank 1), over a data plane
(serve/dataplane.py: `send(rank, msg)`, `recv()`), written down as what came back.

Each step sends its messages and waits until the replies that end it have come, then a
little longer for anything else; what came back is normalized so that token values, token
counts per message (a real engine sends every token as it comes, a simulated one its first
and its last), error texts, timings and statistics do not count, and the rest must match.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from blitzscale.messages import (
    AbortMsg,
    AdoptKVMsg,
    GenerateMsg,
    HelloMsg,
    LiveSplitMsg,
    Message,
    OutputsMsg,
    RecvKVMsg,
    RelayedMsg,
    RelayInMsg,
    RelayMsg,
    SamplingMsg,
    SendKVMsg,
    SendRelayMsg,
    StatsMsg,
)

Event = tuple[object, ...]
PROMPT = list(range(1, 9))
MAX_MODEL_LEN = 256  # both sides' engines are told this (and 64 blocks of 16)
FIVE = SamplingMsg(max_tokens=5, temperature=0.0, ignore_eos=True)
MANY = SamplingMsg(max_tokens=200, temperature=0.0, ignore_eos=True)


class Plane(Protocol):
    async def send(self, rank: int, msg: Message) -> None: ...

    async def recv(self) -> Message: ...


class LiveLoad(Protocol):
    """Rank 2 becoming a live target of rank 0's weights, over several seconds."""

    async def begin(self) -> None:
        """Start the transfer (rank 2 serves while its weights arrive)."""
        ...

    async def end(self) -> None:
        """Wait for the transfer to finish."""
        ...


@dataclass
class Transcript:
    steps: list[tuple[str, list[Event]]] = field(default_factory=list)
    stats: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)  # last, per rank
    first_tokens: dict[str, int] = field(default_factory=dict)  # (for a RecvKV: this side's)
    relayed_at: dict[str, int] = field(default_factory=dict)  # (for a RelayIn: this side's layer)
    _seen_first: set[tuple[int, str]] = field(default_factory=set)

    def events(self, msg: Message) -> list[Event]:
        """`msg` as events: an output's first token and its end; any other reply by kind,
        rank and request; nothing for statistics and hellos (kept apart, or not at all)."""
        if isinstance(msg, StatsMsg):
            self.stats[msg.rank] = (msg.num_running, msg.num_waiting, msg.num_held, msg.used_blocks)
            return []
        if isinstance(msg, HelloMsg):
            return []
        if isinstance(msg, RelayedMsg):  # (the layer it stopped after: timing)
            self.relayed_at[msg.request_id] = msg.layer
        if not isinstance(msg, OutputsMsg):
            return [(type(msg).__name__, getattr(msg, "rank", None), getattr(msg, "request_id", ""))]
        out: list[Event] = []
        for o in msg.outputs:
            key = (msg.rank, o.request_id)
            if o.new_token_ids and key not in self._seen_first:
                self._seen_first.add(key)
                self.first_tokens.setdefault(o.request_id, o.new_token_ids[0])
                out.append(("first", msg.rank, o.request_id))
            if o.finished:
                n = None if o.finish_reason == "abort" else o.num_output_tokens  # (how far: timing)
                out.append(("done", msg.rank, o.request_id, o.finish_reason, n))
        return out


async def _step(
    plane: Plane,
    t: Transcript,
    name: str,
    sends: list[tuple[int, Message]],
    until: set[Event],
    grace_s: float,
) -> None:
    for rank, msg in sends:
        await plane.send(rank, msg)
    got: list[Event] = []
    try:
        async with asyncio.timeout(60):
            while not until <= set(got):
                got += t.events(await plane.recv())
    except TimeoutError:  # (written down: the other side's transcript will differ)
        got += [("never came", *e) for e in until - set(got)]
    try:
        async with asyncio.timeout(grace_s):
            while True:
                got += t.events(await plane.recv())
    except TimeoutError:
        pass
    t.steps.append((name, sorted(got, key=repr)))


def _gen(
    rid: str, params: SamplingMsg = FIVE, hold: bool = False, prompt: list[int] | None = None
) -> GenerateMsg:
    return GenerateMsg(request_id=rid, prompt_token_ids=prompt or PROMPT, params=params, hold_kv=hold)


async def run_script(plane: Plane, live: LiveLoad, grace_s: float) -> Transcript:
    """The script: prompts, a KV hand-off, adopting and releasing held KV, aborts, a relayed
    prompt, what each worker answers to what it cannot do, then a live target (rank 2): its
    events, two prompts it serves while its weights arrive under a planned split, the
    second relayed to rank 0 mid-way, the first finished there."""
    t = Transcript()
    step: Callable[[str, list[tuple[int, Message]], set[Event]], Awaitable[None]]

    async def step(name: str, sends: list[tuple[int, Message]], until: set[Event]) -> None:
        await _step(plane, t, name, sends, until, grace_s)

    await step("prompt", [(1, _gen("c1"))], {("done", 1, "c1", "length", 5)})
    await step("prefill, held", [(0, _gen("p1", hold=True))], {("done", 0, "p1", "migrate", 1)})
    recv = RecvKVMsg(
        request_id="p1",
        src_rank=0,
        token_ids=[*PROMPT, t.first_tokens["p1"]],
        num_prompt_tokens=len(PROMPT),
        num_emitted_chars=0,
        params=FIVE,
    )
    await step("reserve KV", [(1, recv)], {("KVReadyMsg", 1, "p1")})
    await step(
        "send KV",
        [(0, SendKVMsg(request_id="p1", dst_rank=1))],
        {("KVSentMsg", 0, "p1"), ("done", 1, "p1", "length", 5)},
    )
    await step("held to adopt", [(0, _gen("h1", hold=True))], {("done", 0, "h1", "migrate", 1)})
    await step("adopt", [(0, AdoptKVMsg(request_id="h1"))], {("done", 0, "h1", "length", 5)})
    await step("held to release", [(0, _gen("h2", hold=True))], {("done", 0, "h2", "migrate", 1)})
    await step("release", [(0, AbortMsg(request_id="h2"))], set())
    await step("long prompt", [(1, _gen("a1", MANY))], {("first", 1, "a1")})
    await step("abort", [(1, AbortMsg(request_id="a1"))], {("done", 1, "a1", "abort", None)})
    relay = RelayInMsg(request_id="r1", src_rank=0, layer=0, prompt_token_ids=PROMPT, params=FIVE)
    await step("relayed in", [(1, relay)], {("RelayReadyMsg", 1, "r1"), ("done", 1, "r1", "length", 5)})
    await step("relay, not live", [(0, RelayMsg(dst_rank=1))], {("RelayNoneMsg", 0, "")})
    await step(
        "cannot",
        [
            (0, SendKVMsg(request_id="x1", dst_rank=1)),
            (0, AdoptKVMsg(request_id="x2")),
            (0, SendRelayMsg(request_id="x3", dst_rank=1)),
            (1, _gen("x4", prompt=[1] * MAX_MODEL_LEN)),
        ],
        {
            ("KVFailedMsg", 0, "x1"),
            ("KVFailedMsg", 0, "x2"),
            ("RelayLostMsg", 0, "x3"),
            ("RejectedMsg", 1, "x4"),
        },
    )
    await live.begin()
    await step("live target", [], {("LiveReadyMsg", 2, "")})
    # two prompts while its weights arrive; the router's split keeps the first (the head)
    # whole there, so the relay takes the second
    await step("live prompts", [(2, _gen("l0")), (2, _gen("l1"))], set())
    await step("live split", [(2, LiveSplitMsg(layers={"l0": 1 << 20}))], set())
    await step("relay", [(2, RelayMsg(dst_rank=0))], {("RelayedMsg", 2, "l1")})
    relay = RelayInMsg(
        request_id="l1", src_rank=2, layer=t.relayed_at["l1"], prompt_token_ids=PROMPT, params=FIVE
    )
    await step("relay in", [(0, relay)], {("RelayReadyMsg", 0, "l1")})
    await step(
        "relay sent",
        [(2, SendRelayMsg(request_id="l1", dst_rank=0))],
        {("RelaySentMsg", 2, "l1"), ("done", 0, "l1", "length", 5)},
    )
    await step(
        "loaded",
        [],
        {("LiveLoadedMsg", 2, ""), ("LiveDoneMsg", 2, ""), ("done", 2, "l0", "length", 5)},
    )
    await live.end()
    await step("settle", [], set())
    return t
