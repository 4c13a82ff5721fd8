"""A worker measures the cost model of the model it serves on its own device.

A few timed engine steps (prefill of a few prompt lengths, decode at a few batch sizes and
contexts) become a `Profile` (control/costmodel.py): the one definition of "how long does
this model take here" that the router's budgets, the planner's rates and the simulator read.
On a GPU it runs on the standby engine before any weights arrive (random stand-in values:
not zeros, which step faster), on CPU on a scratch engine that is dropped
after; either way it is measured once per model shape, device and engine setting and kept
in the cache folder, so a restart reads it back in milliseconds.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from blitzscale.checkpoint.loader import fill_random
from blitzscale.control.costmodel import Profile

__all__ = ["ProbePoints", "Profile", "measure", "scratch_engine", "stand_in"]
from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.engine.request import RequestStatus
from blitzscale.engine.work import StepWork
from blitzscale.kvcache.cache import KVCache
from blitzscale.model.config import ModelConfig
from blitzscale.model.weights import ModelWeights
from blitzscale.worker.pacing import step_s

if TYPE_CHECKING:
    from blitzscale.model.tp import TensorParallel

log = logging.getLogger("blitzscale.worker")


@dataclass(frozen=True)
class ProbePoints:
    """Where the step times are measured; beyond the last point the profile extends with
    the last slope."""

    prefill_tokens: tuple[int, ...]
    decode_batch: tuple[int, ...]
    decode_context: tuple[int, ...]
    repeats: int

    @property
    def decode_tokens(self) -> int:
        """Tokens each decoding request generates: its first, one step to join the batch,
        `repeats` timed windows of DECODE_WINDOW steps, and a margin."""
        return 2 + self.repeats * DECODE_WINDOW + 2

    @property
    def mixed(self) -> tuple[int, int, int]:
        """The mixed step measured: (prompt tokens, decode rows, their context): a prompt of
        the second prefill point joining a mid-sized decode batch at the longest context."""
        n = self.prefill_tokens[min(1, len(self.prefill_tokens) - 1)]
        b = self.decode_batch[min(2, len(self.decode_batch) - 1)]
        return n, b, max(self.decode_context)

    def tokens_needed(self, step_tokens: int) -> int:
        """KV tokens the probe holds at most at once, in steps of `step_tokens`."""
        n, b, c = self.mixed
        return max(
            max(self.prefill_tokens) + 1,
            max(self.held_tokens(bb, max(self.decode_context), step_tokens) for bb in self.decode_batch),
            self.held_tokens(b, c, step_tokens) + 3 * (n + 1),
        )

    def decoding_tokens(self, batch: int, context: int, step_tokens: int) -> int:
        """Tokens each of `batch` decoding requests of `context` prompt tokens may generate:
        `decode_tokens`, and as many more as the steps their prompts take to prefill (the
        first requests decode through them). Fewer, and the first rows finished before the
        timing ended: on an H200 the probe timed a batch of 256 at context 512 as 10.0 ms a
        step where 256 rows take 12.5 ms."""
        return self.decode_tokens + prefill_steps(batch * context, step_tokens)

    def held_tokens(self, batch: int, context: int, step_tokens: int) -> int:
        return batch * (context + self.decoding_tokens(batch, context, step_tokens) + 2)


def prefill_steps(tokens: int, step_tokens: int) -> int:
    """Steps an engine takes to prefill `tokens` prompt tokens in steps of `step_tokens`
    (and one to spare)."""
    return -(-tokens // max(1, step_tokens)) + 1


DECODE_WINDOW = 4  # decode steps timed together (the fastest of `repeats` such windows counts)


def probe_points(device: torch.device, engine: EngineConfig) -> ProbePoints:
    """A GPU measures up to the engine's own step limits (most of its time goes to
    prefilling the decode batches: 16 s with contexts up to 1024 on an H200 for 8B, a few
    with 512); a CPU worker, whose steps take a thousand times longer, only small shapes (a
    few seconds). Beyond the last point a profile extends with the last slope."""
    step, seqs = engine.max_num_batched_tokens, engine.max_num_seqs
    if device.type == "cuda":
        prefill = (128, 512, 2048, step)
        batch = (1, 16, 64, seqs)
        context = (128, 512)
        repeats = 2
    else:
        prefill = (16, 128, 256)
        batch = (1, 4)
        context = (32,)
        repeats = 1
    return ProbePoints(
        prefill_tokens=_upto(prefill, step),
        decode_batch=_upto(batch, seqs),
        decode_context=context,
        repeats=repeats,
    )


def _upto(points: tuple[int, ...], limit: int) -> tuple[int, ...]:
    return tuple(sorted({min(p, limit) for p in points}))


def fit(points: ProbePoints, engine: LLMEngine) -> ProbePoints:
    """`points` within what `engine` holds: its context and its KV cache (a batch that
    would not fit would queue, and its step would not be the batch measured)."""
    room = engine.pool.num_blocks * engine.config.block_size
    step = engine.config.max_num_batched_tokens
    context = _upto(points.decode_context, min(engine.max_model_len, room) - points.decode_tokens - 4)
    context = tuple(c for c in context if points.held_tokens(1, c, step) <= room) or context[:1]
    batch = tuple(b for b in points.decode_batch if points.held_tokens(b, max(context), step) <= room) or (1,)
    context = _within_context(points, context, max(batch), step, engine.max_model_len)
    return ProbePoints(
        prefill_tokens=_upto(points.prefill_tokens, min(engine.max_model_len - 2, room - 1)),
        decode_batch=batch,
        decode_context=context,
        repeats=points.repeats,
    )


def _within_context(
    points: ProbePoints, context: tuple[int, ...], batch: int, step: int, max_model_len: int
) -> tuple[int, ...]:
    """The contexts whose requests, in a batch of `batch`, end within `max_model_len` while
    timed (a batch's rows decode through its prompts' prefill steps too); none: the longest
    shorter one that does."""

    def ends_in_time(c: int) -> bool:
        return c + points.decoding_tokens(batch, c, step) + 2 <= max_model_len

    kept = tuple(c for c in context if ends_in_time(c))
    if kept:
        return kept
    c = min(context)
    while c > 1 and not ends_in_time(c):
        c -= max(1, c // 8)
    return (c,)


WORKER_THREADS = 1  # torch threads of a worker process (worker/worker.py)
# What the probe measures (2: the mixed step; 3: decode batches that stay whole while timed);
# cached profiles of others are measured again.
PROBE_VERSION = 3


def device_name(device: torch.device, threads: int = 0) -> str:
    """The device as a profile names it; a CPU's with its torch threads (`threads`; 0:
    this process's)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({threads or torch.get_num_threads()} threads)"


def cache_key(
    config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    engine: EngineConfig,
    threads: int = 0,
    tp: int = 1,
) -> str:
    """What a measurement depends on: the model's shapes, dtype, the device (a CPU's with
    `threads`; 0: this process's), the engine's step limits, block size and overlap, the
    instance's tensor-parallel size, and torch."""
    model = asdict(config)
    if model["quant"] == "none":  # (keys of unquantized models as before quantization existed)
        del model["quant"]
    parts = {
        "model": model,
        "dtype": str(dtype),
        "device": device_name(device, threads),
        "engine": [engine.block_size, engine.max_num_batched_tokens, engine.max_num_seqs, engine.overlap],
        "torch": torch.__version__,
        "probe": PROBE_VERSION,
    }
    if tp > 1:  # (keys of TP=1 instances as before TP instances were measured)
        parts["tp"] = tp
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cached_profile(folder: Path, key: str) -> Profile | None:
    path = folder / f"{key}.json"
    if not path.is_file():
        return None
    try:
        return Profile.from_json(json.loads(path.read_text()), str(path))
    except (ValueError, OSError) as e:  # a broken cache entry is measured again
        log.warning("ignoring the cached cost model %s: %s", path, e)
        return None


def save_profile(folder: Path, key: str, profile: Profile) -> None:
    """Written whole or not at all (another worker may be writing the same key)."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"{key}.json.tmp{os.getpid()}"
    profile.save(tmp)
    tmp.replace(folder / f"{key}.json")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(engine: LLMEngine, steps: int) -> float:
    device = engine.model.weights.device
    _sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        engine.step()
    _sync(device)
    return (time.perf_counter() - t) / steps


def _first_token_s(engine: LLMEngine, prompt: list[int], params: SamplingParams) -> float:
    """From adding a prompt (one step's worth) to its first token out of the engine: the
    step, and what a request waits beyond it (sampling, the token read back one step
    later when steps overlap, engine/overlap.py): what the engine alone gives a request."""
    _sync(engine.model.weights.device)
    t = time.perf_counter()
    rid = engine.add_request(prompt, params)
    while not any(o.request_id == rid for o in engine.step()):
        if not engine.has_unfinished():
            raise RuntimeError(f"the cost probe's prompt of {len(prompt)} tokens gave no output")
    took = time.perf_counter() - t
    _drain(engine, [rid])
    return took


def _decoding(
    engine: LLMEngine, points: ProbePoints, batch: int, context: int, vocab: int, gen: torch.Generator
) -> list[str]:
    """`batch` requests of `context` prompt tokens, every one of them decoding now (and
    still decoding through `points.decode_tokens` more steps: `_check_decoding`)."""
    tokens = points.decoding_tokens(batch, context, engine.config.max_num_batched_tokens)
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in _prompts(batch, context, vocab, gen)]
    while any((r := engine.request(i)) is not None and r.num_output_tokens == 0 for i in ids):
        engine.step()
    engine.step()  # every request decoding
    return ids


def _check_decoding(engine: LLMEngine, ids: list[str]) -> None:
    """Every one of `ids` still decoding after a timing: the step timed was the batch named."""
    left = sum(1 for i in ids if engine.request(i, RequestStatus.RUNNING) is not None)
    if left < len(ids):
        raise RuntimeError(f"the cost probe's decode batch of {len(ids)} shrank to {left} while timed")


def _mixed_step_s(engine: LLMEngine, points: ProbePoints, vocab: int, gen: torch.Generator) -> float:
    """A steady run of mixed steps: a decode batch with a new one-token prompt joining at
    every step (the shape of a serving loop's steps under load); the fastest window."""
    n, b, c = points.mixed
    ids = _decoding(engine, points, b, c, vocab, gen)
    rows = list(ids)
    one = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    device = engine.model.weights.device
    best = float("inf")
    for _ in range(points.repeats):
        prompts = _prompts(DECODE_WINDOW, n, vocab, gen)
        _sync(device)
        t = time.perf_counter()
        for p in prompts:
            ids.append(engine.add_request(p, one))
            engine.step()
        _sync(device)
        best = min(best, (time.perf_counter() - t) / DECODE_WINDOW)
    _check_decoding(engine, rows)
    _drain(engine, ids)
    return best


def _drain(engine: LLMEngine, ids: list[str]) -> None:
    for rid in ids:
        engine.abort(rid)
    while engine.has_unfinished():
        engine.step()


def _prompts(n: int, length: int, vocab: int, gen: torch.Generator) -> list[list[int]]:
    return torch.randint(0, vocab, (n, length), generator=gen).tolist()


def measure(engine: LLMEngine, points: ProbePoints, name: str) -> Profile:
    """Time `engine`'s steps at `points` (it must be idle; it is idle again after)."""
    if not engine.is_idle:
        raise ValueError("the cost probe needs an idle engine")
    points = fit(points, engine)
    weights = engine.model.weights
    mc, device = weights.config, weights.device
    gen = torch.Generator().manual_seed(0)
    one = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    engine.generate(_prompts(1, 16, mc.vocab_size, gen), one)  # warm-up

    def prefill_pass() -> list[float]:
        out = []
        for n in points.prefill_tokens:
            prompts = _prompts(points.repeats, n, mc.vocab_size, gen)
            out.append(min(_first_token_s(engine, p, one) for p in prompts))
        return out

    # Two passes, the decode rows between them, the faster of each point kept: small prompts
    # are bound by the host's launches, and on an H200 one pass at a worker's start said
    # 26-35 ms for 128 and 512 tokens in some runs where others said 12-15 ms.
    first = prefill_pass()
    decode_ms = []
    for b in points.decode_batch:
        row = []
        for c in points.decode_context:
            ids = _decoding(engine, points, b, c, mc.vocab_size, gen)
            row.append(min(_timed(engine, DECODE_WINDOW) for _ in range(points.repeats)))
            _check_decoding(engine, ids)
            _drain(engine, ids)
        decode_ms.append(row)
    prefill_ms = [round(1000 * min(a, b), 3) for a, b in zip(first, prefill_pass(), strict=True)]
    per_token = KVCache.bytes_per_block(mc, 1, weights.dtype, weights.layout.tp_size)
    if device.type == "cuda":
        memory = torch.cuda.get_device_properties(device).total_memory
    else:
        memory = weights.layout.nbytes + engine.pool.num_blocks * engine.config.block_size * per_token
    profile = Profile(
        name=name,
        device=device_name(device),
        note=f"measured by the worker at start (torch {torch.__version__})",
        weight_bytes=weights.layout.nbytes,
        kv_bytes_per_token=per_token,
        device_memory_bytes=int(memory),
        memory_utilization=engine.config.gpu_memory_utilization,
        num_layers=mc.num_layers,
        prefill_tokens=points.prefill_tokens,
        prefill_ms=tuple(prefill_ms),
        decode_batch=points.decode_batch,
        decode_context=points.decode_context,
        decode_ms=monotone(decode_ms),
    )
    # The mixed step against the rule without it (worker/pacing.step_s): the rest is its own.
    n, b, c = points.mixed
    rule = step_s(profile, StepWork(prompt_tokens=n, decode_contexts=[c] * b))
    mixed = _mixed_step_s(engine, points, mc.vocab_size, gen)
    return replace(profile, mixed_extra_ms=round(max(0.0, 1000 * (mixed - rule)), 3))


def monotone(ms: list[list[float]]) -> tuple[tuple[float, ...], ...]:
    """Decode step seconds [batch][context] as milliseconds that never fall with more
    context or a larger batch: a step that does more work is not faster, and a profile
    that said so (a noisy point) would extrapolate a falling slope past its last context."""
    out = [list(itertools.accumulate(row, max)) for row in ms]
    for j in range(len(out[0]) if out else 0):
        for i in range(1, len(out)):
            out[i][j] = max(out[i][j], out[i - 1][j])
    return tuple(tuple(round(1000 * x, 3) for x in row) for row in out)


@contextmanager
def stand_in(weights: ModelWeights) -> Iterator[None]:
    """The buffer filled as a random model's and marked whole while the probe runs (a
    standby's buffer is marked missing again after: no weights have arrived). Not zeros:
    on an H200 a probe on zeroed weights said 44 ms for a 2048-token prompt and 9.0 ms a
    decode step at batch 256 where the same engine on random weights took 50-52 and
    13-15 ms in the same run (zeros are the likely cause: a GPU draws less power on them;
    not yet measured side by side)."""
    fill_random(weights, seed=0)
    weights.readiness.mark_all_ready()
    try:
        yield
    finally:
        weights.readiness.reset()


def stand_in_weights(
    config: ModelConfig, dtype: torch.dtype, device: torch.device, tp_size: int = 1, tp_rank: int = 0
) -> ModelWeights:
    """A model's weights (shard `tp_rank` of `tp_size`) as `stand_in`'s values, marked whole."""
    weights = ModelWeights.empty(config, dtype, device, tp_size, tp_rank)
    fill_random(weights, seed=tp_rank)
    weights.readiness.mark_all_ready()
    return weights


def scratch_engine(
    config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    engine: EngineConfig,
    points: ProbePoints,
    tp: TensorParallel | None = None,
) -> LLMEngine:
    """An engine on stand-in weights (`stand_in`'s values) with just the KV cache the
    probe needs; with `tp`, shard 0's engine of a tensor-parallel instance (the group's
    other shards must build theirs: worker/cost_report.py)."""
    weights = stand_in_weights(config, dtype, device, tp.size if tp is not None else 1)
    needed = points.tokens_needed(engine.max_num_batched_tokens)
    blocks = -(-needed // engine.block_size) + max(points.decode_batch) + 1
    cfg = EngineConfig(
        block_size=engine.block_size,
        num_kv_blocks=blocks,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        max_num_seqs=engine.max_num_seqs,
        max_model_len=max(points.prefill_tokens) + max(points.decode_context) + 64,
        overlap=engine.overlap,
    )
    return LLMEngine(weights, None, cfg, tp_group=tp)
