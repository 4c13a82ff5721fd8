"""LLMEngine: one model instance. `step()` = schedule -> run -> sample -> postprocess.

Every request it knows is in one table (`engine/table.py`) with a checked status; the
serving loop (worker/serving.py, worker/relays.py) uses the methods below and the engine's
KV hand-offs (`handoffs`: migration and relays, engine/handoff.py), never the table, the
scheduler or the cache directly.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from collections.abc import Iterator
from typing import Any

import torch

from blitzscale.core.config import EngineConfig
from blitzscale.core.outputs import RequestOutput, TokenLogprob
from blitzscale.core.sampling import SamplingParams
from blitzscale.core.validate import validate_request
from blitzscale.engine.grammar_masks import GrammarMasks
from blitzscale.engine.handoff import KVHandoffs
from blitzscale.engine.live import LiveQueue, finish_relayed
from blitzscale.engine.logits import History, logprobs_of
from blitzscale.engine.model_runner import ModelRunner
from blitzscale.engine.oom import MemoryBackoff, free_cached_memory, oom_error
from blitzscale.engine.output import OutputProcessor
from blitzscale.engine.overlap import PENDING, Overlap, plain
from blitzscale.engine.request import Request, RequestStatus
from blitzscale.engine.sampler import NO_TOKEN, TokenMask, sample
from blitzscale.engine.scheduler import Scheduler, SchedulerOutput
from blitzscale.engine.steptrace import step_trace
from blitzscale.engine.table import STEPPED, RequestTable
from blitzscale.engine.work import StepWork
from blitzscale.errors import InvalidRequestError, KVIntegrityError
from blitzscale.kvcache.cache import KVCache
from blitzscale.kvcache.pool import BlockPool
from blitzscale.model.config import ModelConfig
from blitzscale.model.llama import LlamaModel
from blitzscale.model.readiness import Readiness
from blitzscale.model.weights import ModelWeights

S = RequestStatus
# Check the KV block books after every step (the test suite sets this; workers inherit it).
CHECK_EVERY_STEP = os.environ.get("BLITZSCALE_CHECK_INTEGRITY", "") == "1"


def default_dtype(device: str | torch.device) -> torch.dtype:
    """fp32 on CPU (bit-comparable with references), bf16 on GPU."""
    return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16


def planned_kv_blocks(
    model: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    weight_bytes: int,
    config: EngineConfig,
    tp_size: int = 1,
    room: int | None = None,
) -> int:
    """The KV blocks an engine built now on weights of `model` (`weight_bytes` of them on
    `device`, this shard's of `tp_size`) takes: the blocks asked for; on a GPU, its share of
    the device less its weights when several models are resident, else what is free
    (either way never more than the utilization of what is free: another process may hold
    part of the device); on a CPU, `kv_cache_bytes`. `room`: bytes it may take at most (the
    worker's accounting, worker/memory.py)."""
    cfg = config.for_device(device.type)
    per_block = KVCache.bytes_per_block(model, cfg.block_size, dtype, tp_size)
    if cfg.num_kv_blocks:
        blocks = cfg.num_kv_blocks
    elif device.type == "cuda" and cfg.models_per_device > 1:
        free, total = torch.cuda.mem_get_info(device)
        share = int(total * cfg.gpu_memory_utilization) // cfg.models_per_device
        blocks = min(share - weight_bytes, int(free * cfg.gpu_memory_utilization)) // per_block
    elif device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        blocks = int(free * cfg.gpu_memory_utilization) // per_block
    else:
        blocks = cfg.kv_cache_bytes // per_block
    return blocks if room is None else min(blocks, room // per_block)


class LLMEngine:
    def __init__(
        self,
        weights: ModelWeights,
        tokenizer: Any | None,
        config: EngineConfig,
        tp_group: Any = None,
        kv_room: int | None = None,
    ) -> None:
        """`tp_group`: a tensor-parallel shard's group (LlamaModel's; model/tp.py).
        `kv_room`: bytes its KV cache may take at most (a worker's memory bound)."""
        self.kv_room = kv_room
        self.config = config.for_device(weights.device.type)
        self.tp_group = tp_group
        # a tensor-parallel forward raised part-way: the other shards may be inside its
        # collectives, so this engine must not step again (worker/serving.py ends the worker)
        self.tp_forward_broken = False
        self.tokenizer = tokenizer
        self.model_config = weights.config
        self._init_limits(weights)
        self._init_kv_cache(weights)
        self._init_components(weights)

    def _init_limits(self, weights: ModelWeights) -> None:
        limit = self.config.max_model_len or weights.config.max_position_embeddings
        self.max_model_len = min(limit, weights.config.max_position_embeddings)

    def _init_kv_cache(self, weights: ModelWeights) -> None:
        cfg, bs = self.config, self.config.block_size
        num_blocks = planned_kv_blocks(
            weights.config,
            weights.dtype,
            weights.device,
            weights.layout.nbytes,
            cfg,
            weights.layout.tp_size,
            self.kv_room,
        )
        if num_blocks < 1:
            raise ValueError("no room for a single KV block; lower block_size or free memory")
        self.kv_cache = KVCache(
            weights.config, num_blocks, bs, weights.dtype, weights.device, weights.layout.tp_size
        )
        self.pool = BlockPool(num_blocks, bs)

    @property
    def kv_cache_bytes(self) -> int:
        """The bytes its KV cache holds on the device."""
        return self.kv_cache.data.numel() * self.kv_cache.data.element_size()

    def _init_components(self, weights: ModelWeights) -> None:
        self.model = LlamaModel(weights, max_positions=self.max_model_len, tp_group=self.tp_group)
        self.model.warm_up_attention(self.kv_cache)  # (kernels compiled before any request)
        c = self.config
        self.runner = ModelRunner(
            self.model, self.kv_cache, c.max_num_seqs, self.max_model_len, c.max_num_batched_tokens
        )
        self.trace = step_trace(weights.device)  # BLITZSCALE_STEP_TRACE: a line per step
        self.table = RequestTable(self.pool)  # every request here, with its status
        self.scheduler = Scheduler(
            self.pool,
            self.config.max_num_batched_tokens,
            self.config.max_num_seqs,
            self.table,
            prefix_caching=self.config.prefix_caching,
        )
        # smaller steps after one runs out of device memory (engine/oom.py)
        self.backoff = MemoryBackoff(
            self.scheduler, self.config.max_num_batched_tokens, self.config.max_num_seqs
        )
        self.outputs = OutputProcessor(self.tokenizer, self._eos(), self.max_model_len)
        self.grammar_masks = GrammarMasks(self.tokenizer, self.model_config.vocab_size, sorted(self._eos()))
        self.live: LiveQueue | None = None  # set while this is a live target (weights arriving)
        # KV leaving or entering the cache: migration, relays (the serving loop's way in)
        self.handoffs = KVHandoffs(
            self, self.table, self.scheduler, self.kv_cache, self.outputs, weights.config
        )
        self._aborted: list[Request] = []  # released; their last output goes out next step
        self._step_outputs: list[RequestOutput] = []  # of the step under way
        self.last_work = StepWork()  # what the last step computed (for pacing it)
        self._ids = itertools.count()
        cfg = self.config
        on = cfg.overlap == "on" or (cfg.overlap == "auto" and weights.device.type == "cuda")
        on = on and self.tp_group is None  # (a TP leader sends each step's ids to its shards)
        # the step in flight, if any (None: every step's tokens are read at once)
        self.overlap: Overlap | None = None
        if on:
            self.overlap = Overlap(self.scheduler, self.pool, cfg.max_num_batched_tokens, self.max_model_len)

    @classmethod
    def from_model(
        cls,
        model: str,
        device: str = "cpu",
        dtype: torch.dtype | None = None,
        config: EngineConfig | None = None,
    ) -> LLMEngine:
        """Resolve a model name or path, load it onto `device`, and build an engine."""
        from blitzscale.checkpoint import load_tokenizer, load_weights, resolve_model

        src = resolve_model(model)
        dtype = dtype or default_dtype(device)
        weights = load_weights(src, dtype=dtype, device=device)
        return cls(weights, load_tokenizer(src), config or EngineConfig())

    # --- requests ---------------------------------------------------------------------

    def add_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        hold_kv: bool = False,
    ) -> str:
        """Queue a request. With `hold_kv` it stops after its first token and keeps its KV
        for migration (`held`); its output then has finish_reason "migrate"."""
        self.validate(prompt_token_ids, params)
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        self.check_new_id(request_id)
        req = Request(request_id, list(prompt_token_ids), params, hold_kv=hold_kv)
        if self.live is not None and not self.live.readiness.all_ready:
            req.cacheable = False  # its layers' KV is computed piecewise, maybe partly elsewhere
            self.table.add(req, S.LIVE)
            self.live.add(req)
        else:  # once loaded, new work skips the live queue, which only drains
            self.scheduler.add(req)
        return request_id

    def check_new_id(self, request_id: str) -> None:
        """An id is in use while its request is here, and after an abort until its last
        output has gone out (a new request under it would get that output)."""
        if request_id in self.table or any(r.request_id == request_id for r in self._aborted):
            raise InvalidRequestError(f"request id {request_id!r} is already in use")

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise InvalidRequestError, naming the bad value, for a request that can never run."""
        validate_request(prompt_token_ids, params, self.model_config.vocab_size, self.max_model_len)
        if params.grammar is not None:
            self.grammar_masks.check(params.grammar)
        n = len(prompt_token_ids)
        need = self.pool.blocks_for_tokens(min(n + params.max_tokens, self.max_model_len))
        if need > self.pool.num_blocks:
            raise InvalidRequestError(
                f"prompt plus max_tokens needs {need} KV blocks, the cache holds {self.pool.num_blocks}"
            )

    def abort(self, request_id: str) -> bool:
        """Stop a request the step works on (waiting, running, live, relayed in and
        arrived); False for anything else (held, importing, relaying, unknown: the serving
        loop ends those through their own paths)."""
        self._settle()  # (its last token may still be on the device)
        req = self.table.get(request_id, *STEPPED)
        if req is None:
            return False
        if req.status is S.RELAYED_IN and not (req.handoff is not None and req.handoff.ready):
            return False  # its KV is still arriving; the serving loop aborts it on arrival
        self._take_out(req)
        self.table.release(req, "abort")
        self._aborted.append(req)
        return True

    def _take_out(self, req: Request) -> None:
        """Out of whichever queue orders it (before it is released)."""
        if req.status is S.LIVE and self.live is not None:
            self.live.remove(req)
        else:
            self.scheduler.remove(req)

    def _fail(self, req: Request, error: str) -> RequestOutput:
        """Finish one request with an error (finish_reason "error"); the engine goes on."""
        self._take_out(req)
        self.table.release(req, "error")
        return dataclasses.replace(self._finalize(req), error=error)

    def fail_unfinished(self, error: str) -> list[RequestOutput]:
        """A step raised: every request that may have been in it (anything started, in the
        live queue or relayed in) fails with `error`; requests that never ran and held KV
        are untouched. Returns their final outputs, after the outputs the step produced
        before it raised (requests it finished or held). The engine stays usable."""
        failed, self._step_outputs = self._step_outputs, []  # what the step finished before it raised
        if self.overlap is not None:
            self.overlap.drop()
        for req in self.table.requests(*STEPPED):
            untouched = req.status is S.WAITING and req.num_computed_tokens == 0
            if untouched or not self.abort(req.request_id):  # (a relay still arriving: later)
                continue
            self._aborted.remove(req)
            req.finish_reason = "error"
            failed.append(dataclasses.replace(self._finalize(req), error=error))
        return failed

    def check_integrity(self) -> None:
        """Every used KV block is owned by exactly one request in the table (whatever its
        status) and free + used = total; the scheduler's and the live queue's requests are
        the table's, in the statuses they stand for. Raises KVIntegrityError naming what is
        wrong. Cheap: run it after steps in tests, and whenever the serving loop goes idle."""
        problems = self.table.problems()
        queued = {
            S.WAITING: list(self.scheduler.waiting),
            S.RUNNING: self.scheduler.running,
            S.LIVE: ([*self.live.waiting, *(t.request for t in self.live.tasks)] if self.live else []),
        }
        for status, reqs in queued.items():
            for r in reqs:
                if self.table.get(r.request_id, status) is not r:
                    problems.append(f"{r.request_id!r} is queued as {status.value}, but is {r.status.value}")
            n = self.table.count(status)
            if len(reqs) != n:
                problems.append(f"{n} requests are {status.value}, {len(reqs)} are queued so")
        if problems:
            raise KVIntegrityError("; ".join(problems))

    def has_unfinished(self) -> bool:
        """Anything for `step` to do: requests it works on, or outputs still to send."""
        if self._aborted or self._step_outputs or (self.overlap is not None and self.overlap.busy):
            return True
        return self.table.count(*STEPPED) > 0

    @property
    def is_idle(self) -> bool:
        """No request of any kind here (none held, importing or relaying either)."""
        return not self._aborted and not self.table

    def request(self, request_id: str, *statuses: RequestStatus) -> Request | None:
        """A request here (in one of `statuses`, if given); for reading."""
        return self.table.get(request_id, *statuses)

    def request_ids(self, *statuses: RequestStatus) -> list[str]:
        return self.table.ids(*statuses)

    def counts(self) -> dict[str, int]:
        """Requests by status, and KV blocks used and in all (the serving loop's stats)."""
        c = self.table.counts()
        out = {status.value: c.get(status, 0) for status in RequestStatus if status is not S.FINISHED}
        return {
            **out,
            "used_blocks": self.pool.num_used_blocks,
            "total_blocks": self.pool.num_blocks,
            "prefix_queries": self.scheduler.prefix_queries,
            "prefix_hits": self.scheduler.prefix_hits,
            "oom_retries": self.backoff.retries,
        }

    def free_cached_memory(self) -> None:
        """Give the caching allocator's unused device memory back (CUDA; engine/oom.py)."""
        free_cached_memory(self.kv_cache.data.device)

    def _eos(self) -> set[int]:
        eos = set(self.model_config.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        return eos

    def serve_other_model(self, tokenizer: Any | None) -> None:
        """This idle engine goes on with other weights of the same shape, loaded into its
        buffer in place (a worker's standby engine, worker/standby.py): its cached prefixes
        were computed by the old weights and are forgotten; text, stops and grammars follow
        `tokenizer`. The KV cache, the kernels and the CUDA graphs stay as they are."""
        if not self.is_idle:
            raise RuntimeError("only an idle engine can serve another model")
        self.reset_prefix_cache()
        self.tokenizer = tokenizer
        eos = self._eos()
        self.outputs.tokenizer, self.outputs.eos_token_ids = tokenizer, eos
        self.grammar_masks = GrammarMasks(tokenizer, self.model_config.vocab_size, sorted(eos))

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix (requests keep what they hold); how many blocks' were
        forgotten."""
        return self.pool.reset_prefix_cache()

    # --- the loop ---------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        if self.trace is None:
            self._step()
        else:
            self.trace.begin()
            t = time.perf_counter()
            self._step()
            self.trace.write(self.last_work, time.perf_counter() - t)
        outputs, self._step_outputs = self._step_outputs, []
        if CHECK_EVERY_STEP:
            self.check_integrity()
        return outputs

    def _step(self) -> None:
        """One step; every output goes to `_step_outputs` as soon as it exists, so a step that
        raises half-way still reports what it finished (`fail_unfinished`)."""
        ov = self.overlap
        if ov is not None and ov.busy:
            blocked = self._aborted or self.live is not None or self.table.count(S.RELAYED_IN)
            if blocked or self.scheduler.cap is not None or not ov.can_continue():
                ov.settle(self._emit)
        aborted, self._aborted = self._aborted, []
        self._step_outputs += [self._finalize(r) for r in aborted]
        work = self.last_work = StepWork()
        if self.live is not None:
            done = self.live.step()
            if self.live.last_run is not None:
                work.partial.append(self.live.last_run)
            if done:
                self._complete_prompts([r for r, _ in done], torch.stack([x for _, x in done]))
        ready = [r for r in self.table.requests(S.RELAYED_IN) if r.handoff is not None and r.handoff.ready]
        if ready:
            n = self.model.num_layers
            work.partial += [(r.num_tokens, (n - (r.handoff.layer if r.handoff else 0)) / n) for r in ready]
            logits = finish_relayed(self.model, self.kv_cache, ready)
            for r in ready:
                r.handoff = None
                r.num_computed_tokens = r.num_tokens
            self._complete_prompts(ready, logits)
        if self.live is not None and not self.live.readiness.all_ready:
            return  # nothing else can run on a partial model
        sched = self.scheduler.schedule()
        if sched.is_empty:
            self._settle()
            return
        for s in sched.scheduled:  # (a row of one new token attends like a decode row)
            if s.num_new_tokens == 1:
                work.decode_contexts.append(s.request.num_computed_tokens + 1)
            else:
                work.prompt_tokens += s.num_new_tokens
                work.chunks += 1
                work.prefixed_chunks += s.request.num_computed_tokens > 0
        work.running, work.waiting = len(self.scheduler.running), len(self.scheduler.waiting)
        if self.trace is not None:
            self.trace.launching()
        logits = self._forward(sched)
        if self.trace is not None:
            self.trace.returned()  # (its end event recorded, out of memory or not)
        if logits is None:
            return  # out of memory: nothing of the step counts, smaller steps follow
        work.graph = self.runner.last_was_graph
        sampling = [s.request for s in sched.scheduled if s.completes_prompt]
        for s in sched.scheduled:
            r = s.request
            r.num_computed_tokens += s.num_new_tokens
            self.scheduler.cache_computed(r, len(r.token_ids) - (r.token_ids[-1] == PENDING))
        if ov is not None and self.live is None and all(map(plain, sampling)):
            work.overlapped = ov.busy
            ov.launch(sampling, logits, self._emit)
        else:
            assert ov is None or not ov.busy, "a step with pending tokens must overlap"
            self._sample(sampling, logits)

    def _forward(self, sched: SchedulerOutput) -> torch.Tensor | None:
        """The step's logits, or None if it ran out of device memory (engine/oom.py)."""
        ov = self.overlap
        try:
            logits = self.runner.execute(sched, ov.in_flight if ov is not None else None)
        except Exception as err:
            if self.tp_group is not None:
                self.tp_forward_broken = True
                raise  # (its shards are mid-step: the step fails as a whole, out of memory or not)
            if not isinstance(err, torch.OutOfMemoryError):
                raise
            error = oom_error(err)
        else:
            self.backoff.fitted()
            return logits
        self._out_of_memory(sched, error)  # (here, the failed step's tensors are gone)
        return None

    def _out_of_memory(self, sched: SchedulerOutput, error: str) -> None:
        """The forward of `sched` ran out of device memory: free the allocator's cache, read
        the step in flight (it ran), give back the blocks the failed step allocated, and cap
        the next steps at half of it; a request that alone, at one token, does not fit fails
        with `error`."""
        self.free_cached_memory()
        self._settle()
        for s in sched.scheduled:
            r = s.request
            if r.status is S.RUNNING:  # (not one the step in flight finished)
                self.table.trim_blocks(r, self.pool.blocks_for_tokens(r.num_computed_tokens))
        self.last_work = dataclasses.replace(  # (what ran before it, live or relayed, stays)
            self.last_work, prompt_tokens=0, decode_contexts=[], chunks=0, prefixed_chunks=0, oom=True
        )
        tokens = sum(s.num_new_tokens for s in sched.scheduled)
        if self.backoff.shrink(tokens, len(sched.scheduled)):
            return
        req = sched.scheduled[0].request
        if req.status is S.RUNNING:
            self.backoff.failures += 1
            self._step_outputs.append(self._fail(req, error))

    def _complete_prompts(self, reqs: list[Request], logits: torch.Tensor) -> None:
        """Requests whose whole prompt was computed outside the scheduler (live or relayed):
        they join the running batch, then sample like any other."""
        for r in reqs:
            self.scheduler.add_running(r)
        self._sample(reqs, logits)

    def _sample(self, sampling: list[Request], logits: torch.Tensor) -> None:
        mask = None
        if any(r.params.grammar is not None for r in sampling):
            sampling, logits, mask = self._grammar_mask(sampling, logits)
            if not sampling:
                return
        params = [r.params for r in sampling]
        history = History(sampling, frozenset(self.outputs.eos_token_ids))
        tokens = sample(logits, params, [r.generator for r in sampling], history, mask)
        logprobs = logprobs_of(logits, tokens, params)
        for req, tok, lp in zip(sampling, tokens, logprobs, strict=True):
            self._emit(req, tok, lp)

    def _grammar_mask(
        self, sampling: list[Request], logits: torch.Tensor
    ) -> tuple[list[Request], torch.Tensor, TokenMask | None]:
        """Structured output's mask of this step's rows (engine/grammar_masks.py); a row
        whose grammar cannot be rebuilt fails alone and leaves the step."""
        failed = self.grammar_masks.attach(sampling)
        if failed:
            for i, error in failed.items():
                self._step_outputs.append(self._fail(sampling[i], error))
            keep = [i for i in range(len(sampling)) if i not in failed]
            sampling = [sampling[i] for i in keep]
            logits = logits[torch.tensor(keep, device=logits.device)] if keep else logits[:0]
        return sampling, logits, self.grammar_masks.mask(sampling, logits.shape[-1])

    def _settle(self) -> None:
        if self.overlap is not None:
            self.overlap.settle(self._emit)

    def _emit(self, req: Request, tok: int, logprob: TokenLogprob | None = None) -> None:
        """A request's new token: stop checks, then its output (or its failure)."""
        out = self._step_outputs
        if tok == NO_TOKEN:
            out.append(self._fail(req, "the model produced non-finite logits for it"))
            return
        if req.matcher is not None and not req.matcher.accept(tok):  # (the mask let it through)
            out.append(self._fail(req, f"token {tok} does not fit the response_format grammar"))
            return
        req.token_ids.append(tok)
        if logprob is not None:
            req.logprobs.append(logprob)
        reason = self.outputs.check_stop(req)
        if reason is None and req.matcher is not None and req.matcher.is_terminated:
            reason = "stop"  # the grammar is complete (its stop token, ignore_eos or not)
        if reason is not None:
            self.scheduler.finish(req, reason)  # (the table releases it)
            out.append(self._finalize(req))
        elif req.hold_kv:
            out.append(self.handoffs.hold(req))
        else:
            out.append(self.outputs.make_output(req))

    # --- live scaling (design §2.3): this engine as a live target (relays: `handoffs`) --

    def start_live(self, readiness: Readiness | None = None) -> None:
        """Serve while weights arrive: new requests go to the layer-by-layer live queue.
        `readiness`: which segments the whole instance has (a tensor-parallel leader's view
        of every shard); by default this engine's own weights'."""
        if self.table:
            raise InvalidRequestError("live serving must start on an idle engine")
        self.live = LiveQueue(
            self.model,
            self.kv_cache,
            self.pool,
            self.config.max_num_batched_tokens,
            readiness or self.model.weights.readiness,
        )

    @property
    def live_drained(self) -> bool:
        """Fully loaded and no live task left: the engine can serve normally."""
        live = self.live
        return live is not None and live.readiness.all_ready and not live and not self.table.count(S.RELAYING)

    def end_live(self) -> None:
        """Back to normal serving (the live queue must be empty)."""
        if self.live:
            raise InvalidRequestError("the live queue is not empty")
        self.live = None

    @property
    def is_live(self) -> bool:
        return self.live is not None

    @property
    def readiness(self) -> Readiness:
        """Which weight segments this engine may run: while live, the whole instance's (a
        TP leader's view of every shard), else its own weights'."""
        return self.live.readiness if self.live is not None else self.model.weights.readiness

    def _finalize(self, req: Request) -> RequestOutput:
        return self.outputs.make_output(req)

    # --- conveniences -----------------------------------------------------------------

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[RequestOutput]:
        """Run prompts together to completion; one final output per prompt, in order."""
        for p in prompts:  # all or nothing: no prompt is left queued if a later one is bad
            self.validate(p, params)
        ids = [self.add_request(p, params) for p in prompts]
        final: dict[str, RequestOutput] = {}
        while len(final) < len(ids):
            for out in self.step():
                if out.finished:
                    final[out.request_id] = out
        return [final[i] for i in ids]

    def stream(self, prompt_token_ids: list[int], params: SamplingParams) -> Iterator[RequestOutput]:
        """Outputs of one request as they are produced (other requests keep running)."""
        rid = self.add_request(prompt_token_ids, params)
        while True:
            for out in self.step():
                if out.request_id == rid:
                    yield out
                    if out.finished:
                        return
