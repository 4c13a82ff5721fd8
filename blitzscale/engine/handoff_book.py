"""The books of KV hand-offs, torch-free: a request's KV leaving this engine or entering it,
as statuses in the request table and blocks in the pool. `KVHandoffs` (engine/handoff.py)
adds the moving of the KV itself; the simulator's engine (sim/engine.py) keeps these books
and moves simulated bytes.

Each family is reserve, then commit or cancel, and every change goes through the request
table (`engine/table.py`):
- migration (pd mode): a prefilled request is held (`hold`) until its KV has been sent
  (`release_held`) or it decodes here after all (`adopt_held`); a decode instance reserves
  blocks before any KV is sent (`reserve_import`), then `commit_import` or `cancel_import`;
- relays (live scaling): a live target hands a task over (`relay_out`) and frees it once
  sent (`relay_sent`) or takes it back (`relay_cancelled`); its source reserves blocks
  (`reserve_relay`), then `commit_relay` with the hidden states, or `cancel_relay`;
- hot prefixes (scale-up): a source names its most reused cached blocks (`hot_prefixes`);
  a new instance reserves blocks for them (`reserve_prefixes`), then `commit_prefixes`
  registers them as cached (no request holds them), or `cancel_prefixes`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from blitzscale.core.outputs import RequestOutput
from blitzscale.core.sampling import SamplingParams
from blitzscale.engine.live_order import LiveOrder
from blitzscale.engine.output import OutputProcessor
from blitzscale.engine.request import Handoff, Request, RequestStatus
from blitzscale.engine.scheduler import Scheduler
from blitzscale.engine.table import RequestTable
from blitzscale.errors import InvalidRequestError
from blitzscale.kvcache.pool import HotBlock

S = RequestStatus


class HandoffOwner(Protocol):
    """What the hand-offs use of the engine that composes them."""

    @property
    def live(self) -> LiveOrder | None:
        """The live queue while the engine is a live target (weights arriving)."""
        ...

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise InvalidRequestError for a request that can never run here."""
        ...

    def check_new_id(self, request_id: str) -> None:
        """Raise InvalidRequestError if `request_id` is still in use here."""
        ...


class HandoffBook:
    def __init__(
        self,
        engine: HandoffOwner,
        table: RequestTable,
        scheduler: Scheduler,
        outputs: OutputProcessor,
        num_layers: int,
    ) -> None:
        self.engine = engine
        self.table = table
        self.pool = table.pool
        self.scheduler = scheduler
        self.outputs = outputs
        self.num_layers = num_layers

    # --- relays (live scaling, design §2.3) ---------------------------------------------

    def relay_out(self) -> Request | None:
        """Hand a live task to the source: the head (oldest) while loading; once loaded, the
        newest (the head finishes here soon). Its KV of layers [0, k) stays until sent;
        `handoff` says where it stopped."""
        live = self.engine.live
        if live is None:
            return None
        r = live.relay_head(newest=live.readiness.all_ready)
        if r is not None:
            self.table.move(r, S.RELAYING)
        return r

    def relay_sent(self, request_id: str) -> None:
        r = self.table.get(request_id, S.RELAYING)
        if r is not None:
            self.table.release(r, "relayed")

    def relay_cancelled(self, request_id: str) -> None:
        """The source could not take it: the task goes back to the head of the live queue."""
        r = self.table.get(request_id, S.RELAYING)
        if r is None:
            return
        live = self.engine.live
        if live is None:  # loaded meanwhile: an ordinary request now, computed afresh
            self.table.drop_blocks(r)
            r.handoff = None
            r.num_computed_tokens = 0
            self.scheduler.requeue(r)
        else:
            self.table.move(r, S.LIVE)
            live.put_back(r)

    def reserve_relay(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, layer: int, hold_kv: bool
    ) -> Request:
        """Source side: blocks for a relayed prompt, before its hidden states and KV arrive."""
        self.engine.validate(prompt_token_ids, params)
        self.engine.check_new_id(request_id)
        num_layers = self.num_layers
        if not 0 <= layer < num_layers:
            raise InvalidRequestError(f"relay layer {layer} is outside [0, {num_layers})")
        req = Request(request_id, list(prompt_token_ids), params, hold_kv=hold_kv)
        req.cacheable = False  # its first layers' KV was computed on a live target
        req.block_ids = self._allocate(req.num_tokens)
        req.handoff = Handoff(layer)
        self.table.add(req, S.RELAYED_IN)
        return req

    def commit_relay(self, request_id: str, hidden: Any) -> None:
        """The task's hidden states (a torch.Tensor; None after no layer) and KV are here."""
        req = self.table.get(request_id, S.RELAYED_IN)
        if req is None or req.handoff is None:
            raise InvalidRequestError(f"request {request_id!r} is not being relayed in here")
        req.handoff.hidden = hidden
        req.handoff.ready = True

    def cancel_relay(self, request_id: str) -> None:
        req = self.table.get(request_id, S.RELAYED_IN)
        if req is not None:
            self.table.release(req, "abort")

    def _allocate(self, num_tokens: int) -> list[int]:
        need = self.pool.blocks_for_tokens(num_tokens)
        if not self.pool.can_allocate(need):
            raise InvalidRequestError(f"no room: {need} KV blocks needed, {self.pool.num_free_blocks} free")
        return self.pool.allocate(need)

    # --- hot prefixes (travelling with the weights to a new instance) --------------------

    def hot_prefixes(self, max_blocks: int) -> list[HotBlock]:
        """Up to `max_blocks` of the most reused cached blocks, parents first (none
        without prefix caching)."""
        return self.pool.hot_prefixes(max_blocks) if self.scheduler.prefix_caching else []

    def reserve_prefixes(self, num_blocks: int) -> list[int]:
        """Blocks for arriving prefixes, held until `commit_prefixes` or `cancel_prefixes`:
        only empty ones (a new instance's own cached prefixes are not evicted for them)."""
        if not self.scheduler.prefix_caching:
            raise InvalidRequestError("this engine caches no prefixes ([engine] prefix_caching = false)")
        if num_blocks > self.pool.num_empty_blocks:
            raise InvalidRequestError(
                f"no room for {num_blocks} prefix blocks: {self.pool.num_empty_blocks} empty"
            )
        return self.table.reserve_blocks(num_blocks)

    def commit_prefixes(self, block_ids: list[int], blocks: list[tuple[bytes, bytes, int]]) -> int:
        """The KV of (hash, parent, hits) `blocks` is in `block_ids`: cached now, held by
        nobody. A prefix cached here meanwhile stays in its own block. Returns how many
        were registered."""
        n = sum(
            self.pool.register(b, h, parent, hits)
            for b, (h, parent, hits) in zip(block_ids, blocks, strict=True)
        )
        self.table.free_reserved(block_ids)
        return n

    def cancel_prefixes(self, block_ids: list[int]) -> None:
        self.table.free_reserved(block_ids)

    # --- KV migration (prefill/decode disaggregation) -----------------------------------

    def hold(self, req: Request) -> RequestOutput:
        """Prefill done: the request leaves this instance's batch, its KV waits to migrate."""
        self.scheduler.detach(req)
        req.finish_reason = "migrate"
        out = self.outputs.make_output(req)
        return dataclasses.replace(out, finished=True)

    def adopt_held(self, request_id: str) -> None:
        """Decode a held request here instead of migrating it: its KV is already in place
        (this instance is becoming a decode one)."""
        req = self.table.get(request_id, S.HELD)
        if req is None:
            raise InvalidRequestError(f"request {request_id!r} holds no KV here")
        req.hold_kv = False
        req.finish_reason = None
        self.scheduler.add_running(req)

    def release_held(self, request_id: str) -> None:
        """The KV of a held request has been sent (or is no longer wanted): free it."""
        req = self.table.get(request_id, S.HELD)
        if req is not None:
            self.table.release(req)

    def reserve_import(
        self,
        request_id: str,
        token_ids: list[int],
        num_prompt_tokens: int,
        params: SamplingParams,
        num_emitted_chars: int = 0,
    ) -> Request:
        """Allocate blocks for a request prefilled elsewhere (all but its last token computed).
        The decode side allocates before any KV is sent."""
        self.engine.check_new_id(request_id)
        req = Request(request_id, list(token_ids[:num_prompt_tokens]), params)
        req.token_ids = list(token_ids)
        req.num_computed_tokens = len(token_ids) - 1
        req.block_ids = self._allocate(len(token_ids))
        req.num_emitted_tokens = req.num_output_tokens
        # (its prompt logprobs went out with its first token: a recompute here records none)
        req.num_prompt_logprobs = max(0, num_prompt_tokens - 1)
        self.outputs.check_stop_text(req)
        req.num_emitted_chars = num_emitted_chars
        self.table.add(req, S.IMPORTING)
        return req

    def commit_import(self, request_id: str) -> None:
        req = self.table.get(request_id, S.IMPORTING)
        if req is None:
            raise InvalidRequestError(f"request {request_id!r} is not importing here")
        self.scheduler.add_running(req)

    def cancel_import(self, request_id: str) -> None:
        req = self.table.get(request_id, S.IMPORTING)
        if req is not None:
            self.table.release(req, "abort")

    def blocks_for_tokens(self, n: int) -> int:
        return self.pool.blocks_for_tokens(n)
