"""`bench serve`'s mixes through the engine alone: no HTTP, no router, no worker loop; the
same engine configuration `serve` gives its workers on this device."""

from __future__ import annotations

import time

import torch

from blitzscale.bench.mixes import Burst, ClosedLoop, Mix, Single, median
from blitzscale.core.heap import free_frozen, freeze_heap
from blitzscale.core.outputs import RequestOutput
from blitzscale.engine import LLMEngine, SamplingParams
from blitzscale.engine.engine import default_dtype
from blitzscale.engine.work import StepTally, kinds_between


class TimedSteps:
    """An engine's steps, timed and tallied by kind as a worker's loop tallies them."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.tally = StepTally()

    def __call__(self) -> list[RequestOutput]:
        t = time.perf_counter()
        outs = self.engine.step()
        self.tally.add(self.engine.last_work, time.perf_counter() - t)
        return outs


def _prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, length), generator=gen).tolist()


def _drain(engine: LLMEngine) -> None:
    for rid in engine.request_ids():
        engine.abort(rid)
    while engine.has_unfinished():
        engine.step()


def closed_loop(
    engine: LLMEngine, mix: Mix, streams: int, seed: int = 0, tally: StepTally | None = None
) -> ClosedLoop:
    """`tally`: the measured window's steps by kind are added to it."""
    vocab = engine.model_config.vocab_size
    gen = torch.Generator().manual_seed(seed)

    def add(max_tokens: int = mix.max_tokens) -> None:
        # a new random prompt each time (one seen before would hit the prefix cache)
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        engine.add_request(torch.randint(0, vocab, (mix.prompt_len,), generator=gen).tolist(), params)

    for k in range(streams):
        add(mix.first_tokens(k, streams))
    t0 = time.perf_counter()
    start, end = t0 + mix.warmup_s, t0 + mix.warmup_s + mix.window_s
    tokens = done = 0
    step = TimedSteps(engine)
    while (now := time.perf_counter()) < end:
        if now < start:
            step.tally = StepTally()  # (the window's steps only)
        for o in step():
            if now >= start:
                tokens += len(o.new_token_ids)
            if o.finished:
                done += now >= start
                add()
    _drain(engine)
    if tally is not None:
        for k, t in step.tally.kinds.items():
            tally.kinds[k] = t
    return ClosedLoop(streams, round(tokens / mix.window_s, 1), done, 0)


def burst(engine: LLMEngine, mix: Mix, seed: int = 1) -> Burst:
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    t0 = time.perf_counter()
    ids = {
        engine.add_request(p, params)
        for p in _prompts(mix.burst, mix.burst_len, engine.model_config.vocab_size, seed)
    }
    firsts: list[float] = []
    while ids:
        outs = engine.step()
        now = time.perf_counter() - t0
        for o in outs:
            if o.finished and o.request_id in ids:
                ids.discard(o.request_id)
                firsts.append(now)
    return Burst.of(mix.burst, firsts, refused=0)


def single(engine: LLMEngine, mix: Mix, seed: int = 2) -> Single:
    vocab = engine.model_config.vocab_size
    one = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    ttfts = []
    for p in _prompts(mix.single_runs, mix.single_len, vocab, seed):
        t0 = time.perf_counter()
        engine.generate([p], one)
        ttfts.append(time.perf_counter() - t0)
    params = SamplingParams(max_tokens=mix.stream_tokens, temperature=0, ignore_eos=True)
    stamps = []
    for o in engine.stream(_prompts(1, mix.prompt_len, vocab, seed + 1)[0], params):
        stamps += [time.perf_counter()] * len(o.new_token_ids)
    interval = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
    return Single(mix.single_len, round(median(ttfts), 5), round(interval, 6))


def run_engine_mixes(model: str, device: str, mix: Mix) -> dict[str, object]:
    """Every mix on one engine built as `serve` builds its workers' (then freed)."""
    from blitzscale.checkpoint import load_weights, resolve_model
    from blitzscale.serve.config import SERVE_ENGINE

    dev = torch.device(device)
    if dev.type == "cpu":
        torch.set_num_threads(1)  # as each CPU worker runs (worker/worker.py)
    weights = load_weights(resolve_model(model), dtype=default_dtype(dev), device=dev)
    engine = LLMEngine(weights, None, SERVE_ENGINE.for_device(dev.type))
    try:
        engine.generate(_prompts(2, 64, engine.model_config.vocab_size, 9), SamplingParams(max_tokens=4))
        freeze_heap()  # as a worker does before it serves (core/heap.py): no full collections
        out: dict[str, object] = {"single": single(engine, mix), "burst": burst(engine, mix)}
        for n in mix.streams:
            tally = StepTally()
            out[f"closed_{n}"] = closed_loop(engine, mix, n, tally=tally)
            out[f"closed_{n}_kinds"] = kinds_between(StepTally(), tally)
        return out
    finally:
        del engine, weights
        free_frozen()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
