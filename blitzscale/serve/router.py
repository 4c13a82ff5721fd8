"""The router: one global FCFS queue, dispatch to instances, token streams, KV migration.

Everything here runs on one asyncio loop; the router owns the request table, and changes
the instances only through the control plane's state (`serve/state.py`).
Workers are reached over the data socket (msgspec messages); control
operations (activate, transfer, release) are the cluster's async operations (cluster/base.py),
side by side on different ranks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from blitzscale import clock
from blitzscale.cluster.base import Cluster
from blitzscale.cluster.slotted import free_slots
from blitzscale.control.costmodel import Profile
from blitzscale.control.live_split import DEFAULT_TIME_LIMIT_S, SPLIT_NAMES
from blitzscale.control.snapshot import InstanceState
from blitzscale.control.states import is_serving
from blitzscale.core.chat import ChatOptions
from blitzscale.core.outputs import RequestOutput
from blitzscale.core.roles import Role
from blitzscale.core.sampling import Grammar, SamplingParams
from blitzscale.errors import InvalidRequestError, OverloadedError, RequestFailedError, UnavailableError
from blitzscale.messages import (
    RELAY_EVENTS,
    AbortMsg,
    GenerateMsg,
    HelloMsg,
    KVFailedMsg,
    LiveEvent,
    LostMsg,
    Message,
    OutputsMsg,
    RejectedMsg,
    RelayedMsg,
    RelayNoneMsg,
    RequestEvent,
    ResetPrefixCacheMsg,
    StatsMsg,
)
from blitzscale.serve.dataplane import DataPlane
from blitzscale.serve.instances import Instance
from blitzscale.serve.live import LiveScaling
from blitzscale.serve.migration import KVMigrations
from blitzscale.serve.models import ModelBackend, ServedModel
from blitzscale.serve.placement import Placement
from blitzscale.serve.prefixes import FALLBACK_CAPACITY_BLOCKS, PrefixIndex
from blitzscale.serve.queue import RequestQueue
from blitzscale.serve.requests import RouterRequest, Stage
from blitzscale.serve.respawn import Respawner
from blitzscale.serve.state import ControlState

log = logging.getLogger("blitzscale.router")
T = TypeVar("T")
# A request whose instance died before it produced anything runs again, once: if a second
# instance dies under it too, the request itself may be what kills them, so it fails.
MAX_RERUNS = 1


# Where a model has no cost model (a tensor-parallel one with no profile file).
FALLBACK_BUDGET_TOKENS = 4096
FALLBACK_MAX_REQUESTS = 64


@dataclass(frozen=True)
class RouterConfig:
    mode: str = "pd"  # "pd" (prefill/decode disaggregation) or "colocated"
    # Unprefilled work one prefill instance may hold, in seconds of its model's measured
    # prefill (control/costmodel.py): enough that its device never waits for the next
    # dispatch, little enough that a burst stays in the queue for new instances to take.
    prefill_budget_s: float = 0.5
    prefill_budget_tokens: int = 0  # an explicit budget in prompt tokens instead (0: from seconds)
    max_requests_per_instance: int = 0  # 0: the engine's max_num_seqs
    # Weigh the prompt prefix an instance probably has cached (serve/prefixes.py) against
    # its load: a cached block is prompt work it need not do. Only among instances within
    # a quarter of an engine's batch of the least loaded, so a popular prefix never piles
    # every request onto one instance.
    prefix_aware: bool = True
    health_check_s: float = 0.5
    # Load shedding: a request that could not start within max_queue_wait_s, given the
    # prompt tokens ahead of it and what the model's instances (serving, loading, or free to
    # load) prefill a second, is refused with 429 and Retry-After, and so is one that waited
    # that long. 0: no bound.
    max_queue_wait_s: float = 60.0
    max_queue_tokens: int = 0  # an explicit bound on prompt tokens queued as well (0: none)
    # what a refused client is told to wait, at least (one refused for the time it could
    # start is told when the backlog ahead of it would let it start in time)
    retry_after_s: float = 2.0
    max_migration_wait_s: float = 30.0  # a prefilled request no decode instance took fails
    # pd mode: no new prompt is prefilled while this many prefilled requests wait for a
    # decode instance (0: no bound); they wait in the queue instead, where a request that
    # cannot be served in time is refused (429) before any work is spent on it.
    max_pending_migrations: int = 64
    # How a loading live target's queued prompts are split with its partner: "greedy"
    # (ZigZag: the target runs what has landed, the partner pulls the head when idle) or
    # "ilp" (control/live_split.py: an integer program plans each task's layers, falling
    # back to greedy past the time limit).
    live_split: str = "greedy"
    live_split_time_limit_s: float = DEFAULT_TIME_LIMIT_S

    def __post_init__(self) -> None:
        if self.mode not in ("pd", "colocated"):
            raise ValueError(f"mode must be 'pd' or 'colocated', got {self.mode!r}")
        if self.live_split not in SPLIT_NAMES:
            raise ValueError(f"live_split must be one of {', '.join(SPLIT_NAMES)}, got {self.live_split!r}")
        if not self.live_split_time_limit_s > 0:
            raise ValueError(f"live_split_time_limit_s must be > 0, got {self.live_split_time_limit_s}")
        if not self.prefill_budget_s > 0:
            raise ValueError(f"prefill_budget_s must be > 0 seconds, got {self.prefill_budget_s}")
        for name in (
            "prefill_budget_tokens",
            "max_requests_per_instance",
            "max_queue_tokens",
            "max_queue_wait_s",
            "retry_after_s",
            "max_migration_wait_s",
            "max_pending_migrations",
        ):
            if not getattr(self, name) >= 0:  # (NaN too)
                raise ValueError(f"{name} must be >= 0 (0: derived or no bound), got {getattr(self, name)}")
        if not self.health_check_s > 0:
            raise ValueError(f"health_check_s must be > 0 seconds, got {self.health_check_s}")


class Router:
    def __init__(
        self,
        cfg: RouterConfig,
        cluster: Cluster,
        data: DataPlane,
        tokenizer: Any,
        model_name: str,
        vocab_size: int,
        max_model_len: int,
        tp: int = 1,
    ) -> None:
        """`tp`: ranks per instance; the router talks to each instance's first rank. The
        model given here is the default one (requests naming no model); `add_model` adds
        others, which share the instances' ranks."""
        self.cfg = cfg
        self.cluster = cluster
        self.data = data
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.model_root: str | None = None  # the checkpoint's Hugging Face id, where known
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self._models: dict[str, ModelBackend] = {}
        self.add_model(ServedModel(model_name, tokenizer, vocab_size, max_model_len))
        self.last_request_at: dict[str, float] = {}  # by model: when it last got a request
        self.state = ControlState(tp, default_model=model_name)  # instances, live pairs, relays: one owner
        self.queue = RequestQueue(cfg.max_queue_tokens, cfg.max_queue_wait_s)
        self.num_refused: Counter[str] = Counter()  # requests refused, by reason
        self.reqs: dict[str, RouterRequest] = {}
        self.migrations = KVMigrations(self, cfg.max_migration_wait_s)  # pd: prefilled KV going to decode
        self.connected: set[int] = set()
        self.dead_ranks: set[int] = set()  # workers found dead and not yet back
        self.respawner = Respawner(cluster, cluster.cfg.max_restarts, self._rank_back)
        self.on_rank_back: list[Callable[[int], None]] = []  # e.g. the scaler's backoff
        # a request came for a model no instance serves (e.g. at zero): the scaler's kick
        self.on_unserved: list[Callable[[str], None]] = []
        # ZigZag: live pairs, relays, the split of a live target's tasks, live counters
        self.live = LiveScaling(self, cfg.mode == "pd", cfg.live_split, cfg.live_split_time_limit_s)
        self.placement = Placement(self, self.live, colocated=cfg.mode == "colocated")
        self.prefixes = PrefixIndex()  # which prompt prefixes each instance was sent
        self.num_prefix_routed = 0  # requests sent where a prefix of theirs was likely cached
        self.prefix_routed_tokens = 0  # prompt tokens those had cached there, by the index
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._recv_loop()), asyncio.create_task(self._dispatch_loop())]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.respawner.stop()

    @property
    def instances(self) -> Mapping[int, Instance]:
        """The instances, read-only (changes go through `self.state`)."""
        return self.state.instances

    def wake(self) -> None:
        """Run a dispatch round soon (something it waits for may have changed)."""
        self._wake.set()

    # --- models -------------------------------------------------------------------------

    def add_model(self, model: ServedModel) -> None:
        if model.name in self._models and model.name != self.model_name:
            raise ValueError(f"model {model.name!r} is served already")
        self._models[model.name] = ModelBackend(self, model)

    def model_names(self) -> list[str]:
        """Every model served, the default one first."""
        return list(self._models)

    def for_model(self, name: str) -> ModelBackend | None:
        return self._models.get(name)

    def served(self, name: str) -> ServedModel:
        return self._models[name].model

    def requests_of(self, model: str) -> int:
        """Requests of `model` queued or in flight."""
        return sum(1 for r in self.reqs.values() if r.model == model)

    def oldest_queued_at(self, model: str) -> float | None:
        """When the oldest queued request of `model` arrived (None: none queued)."""
        return min((q.arrival for q in self.queue if q.model == model), default=None)

    # --- ServingBackend -----------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return self._models[self.model_name].encode(text)

    def decode(self, token_ids: list[int]) -> str:
        return self._models[self.model_name].decode(token_ids)

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        options: ChatOptions | None = None,
    ) -> list[int]:
        return self._models[self.model_name].encode_chat(messages, tools, options)

    def chat_template(self) -> str | None:
        return self._models[self.model_name].chat_template()

    def check_grammar(self, grammar: Grammar) -> None:
        self._models[self.model_name].check_grammar(grammar)

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self._models[self.model_name].validate(prompt_token_ids, params)

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        model: str | None = None,
        stream: bool = True,
    ) -> AsyncIterator[RequestOutput]:
        """Serve a request of `model` (None: the default one). `stream=False`: its client
        reads only the whole answer, so it runs again if its instance dies mid-answer."""
        name = model or self.model_name
        if name not in self._models:
            raise InvalidRequestError(
                f"model {name!r} is not served here; served: {self.model_names()}", "model"
            )
        self._models[name].validate(prompt_token_ids, params)
        if request_id in self.reqs:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        if not self.queue.can_take(len(prompt_token_ids)):
            self.num_refused["queue_full"] += 1
            raise OverloadedError(
                f"the server is overloaded: {self.queue.num_tokens} prompt tokens are queued "
                f"(limit {self.cfg.max_queue_tokens}); retry later",
                self.cfg.retry_after_s,
            )
        wait = self.expected_start_s(name, len(prompt_token_ids))
        if self.cfg.max_queue_wait_s and wait > self.cfg.max_queue_wait_s:
            self.num_refused["queue_full"] += 1
            raise OverloadedError(
                f"the server is overloaded: the request could start in about {wait:.1f} s "
                f"({self.queue.tokens_of(name)} prompt tokens are queued for {name}), more than "
                f"max_queue_wait_s={self.cfg.max_queue_wait_s:g}; retry later",
                # (when the backlog ahead would let it start in time, if no more arrives)
                max(self.cfg.retry_after_s, wait - self.cfg.max_queue_wait_s),
            )
        r = RouterRequest(request_id, list(prompt_token_ids), params, model=name, stream=stream)
        self.last_request_at[name] = clock.now()
        self.reqs[request_id] = r
        self.queue.push(r)
        self._wake.set()
        if not any(i.model == name and i.accepts is not None for i in self.instances.values()):
            for fn in self.on_unserved:
                fn(name)
        try:
            while True:
                item = await r.out.get()
                if isinstance(item, Exception):
                    raise item
                yield item
                if item.finished:
                    return
        finally:
            if r.stage is not Stage.DONE:
                await self.abort(request_id)

    async def reset_prefix_cache(self) -> int:
        """Every serving instance forgets its cached prefixes (`POST /reset_prefix_cache`:
        benchmark clients reset between runs); how many instances were told."""
        told = [i for i in self.instances.values() if is_serving(i.state)]
        self.prefixes.forget()
        for i in told:
            for rank in i.ranks:
                await self._send(rank, ResetPrefixCacheMsg())
        return len(told)

    async def abort(self, request_id: str) -> None:
        r = self.reqs.pop(request_id, None)
        if r is None:
            return
        if r.stage is Stage.QUEUED:
            self.queue.remove(r)
        if r.stage is Stage.MIGRATING and r.decode_rank is not None and r.prefill_rank is not None:
            await self.migrations.abort(r)  # its hand-off must still be matched
            return
        for rank in {r.prefill_rank, r.decode_rank, r.relay_from} - {None}:
            await self._send(rank, AbortMsg(request_id=r.wire_id))  # type: ignore[arg-type]
        self._release_assignment(r)
        r.move(Stage.DONE)

    @property
    def pending_migrations(self) -> deque[RouterRequest]:
        """Prefilled requests waiting for a decode instance."""
        return self.migrations.pending

    def request_of(self, wire_id: str) -> RouterRequest | None:
        """The request a worker's message names, or None: finished, or the message is about
        an earlier run of it (a rerun gets a new wire id)."""
        r = self.reqs.get(wire_id)
        if r is None:
            base, sep, _ = wire_id.rpartition("#")
            r = self.reqs.get(base) if sep else None
        return r if r is not None and r.wire_id == wire_id else None

    def queue_time_s(self, request_id: str) -> float | None:
        """Seconds the request waited in the global queue (the API's x-queue-time)."""
        r = self.reqs.get(request_id)
        return None if r is None or r.dispatched_at is None else r.dispatched_at - r.arrival

    def health(self) -> dict[str, Any]:
        """ "ok", or "degraded" with the reasons when nothing can serve a request end to end
        (the HTTP edge answers 503 then); `warnings`: what is lost for good though the
        rest serves (a worker that died more often than it may be restarted)."""
        problems = []
        for name, backend in self._models.items():
            mine = [i for i in self.instances.values() if i.model == name]
            if backend.model.may_idle_at_zero and all(i.state is InstanceState.INACTIVE for i in mine):
                continue  # scaled to zero: its next request brings it back
            roles = {i.accepts for i in mine if i.rank in self.connected}
            if self.cfg.mode == "colocated" and roles & {"colocated", "prefill"}:
                roles.add("colocated")  # a live target serves as a prefill-side instance
            needed = ("prefill", "decode") if self.cfg.mode == "pd" else ("colocated",)
            of = f" of {name}" if len(self._models) > 1 else ""
            problems += [f"no {role} instance{of} is serving" for role in needed if role not in roles]
        warnings = [
            f"worker {rank} is out of the pool for good: it died after {self.respawner.max_restarts} restarts"
            for rank in sorted(self.respawner.given_up)
        ]
        return {
            "status": "degraded" if problems else "ok",
            "problems": problems,
            "warnings": warnings,
            "model": self.model_name,
            "mode": self.cfg.mode,
            "queue": len(self.queue),
            "instances": {i.id: i.state.value for i in self.instances.values()},
            "models": self.costs(),
        }

    # --- budgets in seconds of each model's measured work --------------------------------

    def cost(self, model: str) -> Profile | None:
        backend = self._models.get(model)
        return backend.model.cost if backend is not None else None

    def prefilling_on(self, rank: int) -> list[RouterRequest]:
        """Requests whose prompt `rank` holds and has not prefilled, oldest dispatch first."""
        mine = [r for r in self.reqs.values() if r.prefill_rank == rank and r.stage is Stage.PREFILL]
        mine = [r for r in mine if not r.prefilled and r.relay_from is None]
        return sorted(mine, key=lambda r: r.dispatched_at or 0.0)

    def ttft_slo_s(self, model: str) -> float:
        backend = self._models.get(model)
        return backend.model.ttft_slo_s if backend is not None else 0.0

    def budget_tokens(self, model: str) -> int:
        """Prompt tokens one prefill instance of `model` may have outstanding."""
        if self.cfg.prefill_budget_tokens:
            return self.cfg.prefill_budget_tokens
        cost = self.cost(model)
        return cost.prefill_tokens_in(self.cfg.prefill_budget_s) if cost else FALLBACK_BUDGET_TOKENS

    def max_requests(self, model: str) -> int:
        """Requests one instance of `model` may have at once (its engine's batch)."""
        if self.cfg.max_requests_per_instance:
            return self.cfg.max_requests_per_instance
        backend = self._models.get(model)
        seqs = backend.model.max_num_seqs if backend is not None else 0
        return seqs or FALLBACK_MAX_REQUESTS

    def expected_start_s(self, model: str, num_tokens: int) -> float:
        """When a new prompt of `num_tokens` could start, in seconds: the prompt tokens
        ahead of it (queued, and outstanding at the model's instances) over what the
        instances that serve it, load it or could load it prefill a second. 0: unknown.
        With several models resident per GPU a worker's free slots count once, and not at
        all where the model is already (cluster/slotted.py `free_slots`)."""
        cost = self.cost(model)
        if cost is None:
            return 0.0
        mine = [
            i for i in self.instances.values() if i.model == model and i.state is not InstanceState.INACTIVE
        ]
        prefilling = sum(1 for i in mine if i.accepts != "decode")
        tp = self.state.tp
        idle = [r for r in self.cluster.alive_ranks() if r % tp == 0 and self.state.is_free(r)]
        free = len(free_slots(self.cluster, model, idle, [r for i in mine for r in i.ranks]))
        ahead = self.queue.tokens_of(model) + sum(i.outstanding_tokens for i in mine) + num_tokens
        return ahead / (cost.prefill_rate() * max(1, prefilling + free))

    def costs(self) -> dict[str, Any]:
        """Each model's cost model and the budgets it gives (`/health`)."""
        out: dict[str, Any] = {}
        for name, backend in self._models.items():
            cost = backend.model.cost
            out[name] = {
                "cost_model": cost.summary() if cost is not None else None,
                "prefill_budget_tokens": self.budget_tokens(name),
                "max_requests_per_instance": self.max_requests(name),
            }
        return out

    # --- dispatch -----------------------------------------------------------------------

    async def _dispatch_loop(self) -> None:
        last_check = 0.0
        while True:
            # (asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancel
            # that lands as its timeout fires, and stop() would then wait forever)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.01):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self._dispatch_queue()
                await self.migrations.retry()
                await self.live.round()
                if clock.now() - last_check > self.cfg.health_check_s:
                    last_check = clock.now()
                    self._fail_dead_instances()
            except Exception:  # one bad round must not stop dispatching for good
                log.exception("dispatch round failed")

    def pick(
        self, role: Role, need_tokens: int = 0, model: str | None = None, prefix: list[bytes] | None = None
    ) -> Instance | None:
        """The instance of `model` (None: the default one) that takes this `role` work
        (serve/placement.py). `prefix`: the prompt's block hashes (`prefix_aware`)."""
        return self.placement.pick(role, need_tokens, model or self.model_name, prefix)

    def prefix_block_size(self, model: str) -> int:
        """The KV block size `model`'s engines cache prefixes in (0: they do not)."""
        backend = self._models.get(model)
        return backend.model.prefix_block_size if backend is not None else 0

    def _prefix_of(self, r: RouterRequest) -> list[bytes] | None:
        """`r`'s prompt block hashes, if its model's instances cache prefixes (once per request)."""
        block = self._models[r.model].model.prefix_block_size if r.model in self._models else 0
        if not (self.cfg.prefix_aware and block):
            return None
        if r.prefix_hashes is None:
            r.prefix_hashes = PrefixIndex.hashes(r.prompt, block)
        return r.prefix_hashes

    def _note_prefix(self, r: RouterRequest, inst: Instance, prefix: list[bytes] | None) -> None:
        """`inst` will hold `r`'s prompt blocks once it has prefilled them."""
        if not prefix:
            return
        hit = self.prefixes.cached_blocks(r.model, inst.rank, inst.loaded_at, prefix)
        if hit:
            self.num_prefix_routed += 1
            self.prefix_routed_tokens += hit * self._models[r.model].model.prefix_block_size
        cap = inst.stats.total_blocks if inst.stats is not None else FALLBACK_CAPACITY_BLOCKS
        self.prefixes.record(r.model, inst.rank, inst.loaded_at, prefix, cap)

    def prefixes_shipped(self, model: str, rank: int, hashes: list[bytes]) -> None:
        """Hot prefix blocks of `model` that reached `rank` with its weights (the scaler
        shipped them): cached there now, as if prompts with them had been sent."""
        inst = self.instances.get(rank)
        if inst is None or not self.cfg.prefix_aware:
            return
        cap = inst.stats.total_blocks if inst.stats is not None else FALLBACK_CAPACITY_BLOCKS
        self.prefixes.record(model, rank, inst.loaded_at, hashes, cap)

    async def _dispatch_queue(self) -> None:
        role = "prefill" if self.cfg.mode == "pd" else "colocated"
        for late in self.queue.pop_expired(clock.now()):
            self.num_refused["queue_timeout"] += 1
            late.out.put_nowait(
                OverloadedError(
                    f"the server is overloaded: the request waited {self.cfg.max_queue_wait_s:g} s "
                    "in the queue; retry later",
                    self.cfg.retry_after_s,
                )
            )
            self.finish(late)
        backlog = self.cfg.max_pending_migrations if self.cfg.mode == "pd" else 0
        waiting: set[str] = set()  # models whose oldest request found no instance this round
        for r in list(self.queue):
            if backlog and len(self.migrations.pending) >= backlog:
                return  # decode is the bottleneck: prefilling more would only fail later
            if r.model in waiting:
                continue
            prefix = self._prefix_of(r)
            inst = self.pick(role, len(r.prompt), r.model, prefix)
            if inst is None:  # FCFS per model: it waits, and so do its model's later ones
                waiting.add(r.model)
                if len(waiting) == len(self._models):
                    return
                continue
            self.queue.remove(r)
            r.move(Stage.PREFILL)
            r.prefill_rank, r.dispatched_at = inst.rank, clock.now()
            self.state.assign(inst.rank, len(r.prompt))
            self.live.dispatched(inst.rank)
            self._note_prefix(r, inst, prefix)
            hold = self.cfg.mode == "pd"
            msg = GenerateMsg(
                request_id=r.wire_id, prompt_token_ids=r.prompt, params=r.sampling_msg(), hold_kv=hold
            )
            try:
                await self._send(inst.rank, msg)
            except Exception as e:  # (one that cannot be encoded): it fails, the queue goes on
                log.exception("request %s could not be sent to instance %d", r.id, inst.rank)
                r.out.put_nowait(RequestFailedError(f"the request could not be sent ({type(e).__name__})"))
                self.finish(r)

    # --- lost requests ------------------------------------------------------------------

    def lost(self, r: RouterRequest, why: str, dead: set[int] | None = None) -> None:
        """An instance lost `r`: run it again if the client has seen nothing yet (no token
        streamed: a client that reads only the whole answer sees none before the end), else
        fail it. A request whose KV is moving between instances fails (its hand-off is
        under way). `dead`: the lost ranks died; a request found on more than MAX_RERUNS
        dead instances is not run again (it may be what kills them)."""
        r.died_on |= dead or set()
        rerun = not r.client_saw_output and r.stage in (Stage.PREFILL, Stage.DECODE)
        if rerun and len(r.died_on) <= MAX_RERUNS:
            log.warning("request %s: %s; running it again", r.id, why)
            self._requeue(r)
        else:  # streamed already, or it was on a dying instance before: it may be the cause
            r.out.put_nowait(UnavailableError(why))
            self.finish(r)

    def _requeue(self, r: RouterRequest) -> None:
        """Run a request again from the front of the queue (it has no output yet), under a
        new wire id: what is left of the last run on a worker keeps the old one."""
        self._release_assignment(r)
        r.move(Stage.QUEUED)
        r.prefilled = False
        r.attempt += 1
        if (restarted := r.restart()) is not None:
            r.out.put_nowait(restarted)
        self.queue.push_front(r)
        self._wake.set()

    # --- worker messages ----------------------------------------------------------------

    async def _recv_loop(self) -> None:
        while True:
            msg = await self.data.recv()
            try:
                await self._on_message(msg)
            except Exception:  # a bug in one handler must not stop every stream
                log.exception("handling %s failed", type(msg).__name__)

    async def _on_message(self, msg: Message) -> None:
        if isinstance(msg, OutputsMsg):
            await self._on_outputs(msg)
        elif isinstance(msg, LiveEvent):
            self.live.on_live_event(msg)
        elif isinstance(msg, RelayNoneMsg):
            self.live.on_none(msg.rank)
        elif isinstance(msg, RELAY_EVENTS):
            await self.live.on_event(msg)
        elif isinstance(msg, RequestEvent):
            await self._on_event(msg)
        elif isinstance(msg, StatsMsg):
            self.state.on_stats(msg)
        elif isinstance(msg, RelayedMsg):
            await self.live.on_relayed(msg)
        elif isinstance(msg, HelloMsg):
            self.connected.add(msg.rank)
            self._wake.set()

    async def _on_outputs(self, msg: OutputsMsg) -> None:
        for o in msg.outputs:
            r = self.request_of(o.request_id)
            if r is None:
                continue
            if r.stage is Stage.PREFILL and not r.prefilled:
                r.prefilled = True
                self.state.take_tokens(msg.rank, len(r.prompt))
                self.live.count(r, o.live_layers)
                self._wake.set()  # its budget is free again: dispatch now, not at the next tick
            if o.finish_reason == "error":  # the request broke its step: never rerun it
                await r.out.put(RequestFailedError(f"request failed on rank {msg.rank}: {o.error}"))
                self.finish(r)
            elif o.finish_reason == "migrate":
                r.rng_state = o.rng_state
                await r.out.put(r.accept(o, finished=False))
                r.move(Stage.MIGRATING)
                await self.migrations.start(r)
            else:
                await r.out.put(r.accept(o, finished=o.finished))
                if o.finished:
                    self.finish(r)

    async def _on_event(self, ev: RequestEvent) -> None:
        r = self.request_of(ev.request_id)
        if r is None:  # gone, or aborted with its hand-off still running
            await self.migrations.on_aborted_event(ev)
            return
        if isinstance(ev, LostMsg):
            self.lost(r, f"rank {ev.rank} lost it: {ev.error}")
        elif await self.migrations.on_event(r, ev):
            return
        elif isinstance(ev, KVFailedMsg | RejectedMsg):
            bad = isinstance(ev, RejectedMsg)
            await r.out.put(InvalidRequestError(ev.error) if bad else RequestFailedError(ev.error))
            self.finish(r)

    def _fail_dead_instances(self) -> None:
        dead = self.cluster.dead_now()  # newly dead ranks leave the pool
        if not dead:
            return
        for rank in sorted(dead - self.dead_ranks):
            log.error("worker %d died; its requests run again or fail, its copies leave the pool", rank)
            self.respawner.died(rank)
        self.dead_ranks |= dead
        gone = {self.state.owner(rank) for rank in dead}  # a TP instance dies with any shard
        self.live.drop_dead_relays(gone)
        self.migrations.drop_dead(gone)
        for r in list(self.reqs.values()):
            involved = {r.prefill_rank, r.decode_rank, r.relay_from} - {None}
            ranks = involved & gone
            if ranks:  # run again if nothing was produced yet (no client can tell), else fail
                for rank in involved - gone:  # survivors drop their part (blocks, receives)
                    self._send_nowait(rank, AbortMsg(request_id=r.wire_id))  # type: ignore[arg-type]
                self.lost(r, f"instance on rank {sorted(ranks)} died", ranks)
        for rank in gone:
            inst = self.instances.get(rank)
            if inst is not None and inst.state is not InstanceState.INACTIVE:
                self.state.move(rank, InstanceState.INACTIVE, "(worker died)")
                self.connected.discard(rank)
        for target, lost in self.state.starved(gone).items():
            self.abandon_live(target, f"its weight source (rank {lost}) died")
        self.live.drop_dead_pairs(gone)

    def abandon_live(self, target: int, why: str) -> int:
        """A live target whose weights will not all arrive (`why`: its weight source died)
        serves no more, now: the prompts waiting for its missing layers are taken back and
        run again elsewhere, rather than when its transfer gives up (a receive cut mid-piece
        waits out its timeout, 30 s). Prompts it relayed live on at their source; a target
        that holds every layer already is left alone. The number of prompts run again."""
        inst = self.instances.get(target)
        if inst is None or inst.state is not InstanceState.NEW_PREFILL:
            return 0
        waiting = [
            r
            for r in self.reqs.values()
            if r.prefill_rank == target and r.stage is Stage.PREFILL and not r.prefilled
        ]
        for r in waiting:
            self._send_nowait(target, AbortMsg(request_id=r.wire_id))  # type: ignore[arg-type]
            self.lost(r, f"the live target on rank {target} cannot finish it: {why}")
        self.state.move(target, InstanceState.INACTIVE, f"({why})")
        self.live.end(target)
        self.live.abandoned_total += 1
        return len(waiting)

    def _rank_back(self, rank: int) -> None:
        """A respawned worker is up with its links rebuilt: the planner may use it again."""
        self.dead_ranks.discard(rank)
        for fn in self.on_rank_back:
            fn(rank)
        self._wake.set()

    # --- bookkeeping --------------------------------------------------------------------

    def finish(self, r: RouterRequest) -> None:
        self._release_assignment(r)
        r.move(Stage.DONE)
        self.reqs.pop(r.id, None)
        self._wake.set()

    def _release_assignment(self, r: RouterRequest) -> None:
        if r.stage is Stage.PREFILL and not r.prefilled:
            self.state.take_tokens(r.prefill_rank, len(r.prompt))
        for rank in (r.prefill_rank, r.decode_rank, r.relay_from):
            self.state.unassign(rank)
        r.prefill_rank = r.decode_rank = r.relay_from = None

    async def _send(self, rank: int, msg: Message) -> None:
        await self.data.send(rank, msg)

    def _send_nowait(self, rank: int, msg: Message) -> None:
        self.data.send_nowait(rank, msg)
