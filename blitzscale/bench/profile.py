"""`blitzscale profile`: our engine's prefill and decode step times on this machine, as the
simulator's cost model (blitzscale/control/costmodel.py).

Prefill: one prompt of n tokens, prefilled in one step. Decode: b sequences at context c,
the mean of a few steps after all are prefilled. Random prompts; greedy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from blitzscale.bench.engine_bench import _timed
from blitzscale.checkpoint import load_weights, resolve_model
from blitzscale.control.costmodel import Profile
from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.engine.engine import default_dtype
from blitzscale.engine.request import RequestStatus
from blitzscale.kvcache.cache import KVCache


@dataclass(frozen=True)
class ProfileConfig:
    model: str = "smollm2-135m"
    device: str = "cpu"
    prefill_tokens: tuple[int, ...] = (16, 128, 512, 1024, 2048)
    decode_batch: tuple[int, ...] = (1, 4, 16, 64)
    decode_context: tuple[int, ...] = (128, 512, 1024)
    steps: int = 4
    block_size: int = 16
    memory_bytes: int = 0  # what one instance holds (0: the GPU's memory; CPU: weights + 8192 tokens of KV)


def measure_profile(cfg: ProfileConfig, log: Callable[[str], None] = print) -> Profile:
    device = torch.device(cfg.device)
    dtype = default_dtype(device)
    weights = load_weights(resolve_model(cfg.model), dtype=dtype, device=device)
    mc = weights.config
    per_token = KVCache.bytes_per_block(mc, 1, dtype, 1)
    budget = max(cfg.prefill_tokens)
    # Requests that finish their prompts first decode while the others prefill: each may
    # generate one token per prefill step, plus the timed steps, and must still be running
    # when those are timed (else the batch measured is smaller than its label).
    extra = -(-max(cfg.decode_batch) * max(cfg.decode_context) // budget) + cfg.steps + 8
    max_ctx = max(max(cfg.decode_context) + extra, max(cfg.prefill_tokens) + 8)
    tokens = max(max(cfg.decode_batch) * (max(cfg.decode_context) + extra), max_ctx)
    engine = LLMEngine(
        weights,
        None,
        EngineConfig(
            block_size=cfg.block_size,
            num_kv_blocks=-(-tokens // cfg.block_size) + max(cfg.decode_batch),
            max_num_batched_tokens=budget,
            max_num_seqs=max(cfg.decode_batch),
            max_model_len=max_ctx,
        ),
    )
    gen = torch.Generator().manual_seed(0)

    def prompts(n: int, length: int) -> list[list[int]]:
        return torch.randint(0, mc.vocab_size, (n, length), generator=gen).tolist()

    one = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    engine.generate(prompts(1, 16), one)  # warm-up
    prefill_ms = []
    for n in cfg.prefill_tokens:
        p = prompts(1, n)
        engine.generate(p, one)
        prefill_ms.append(
            round(1000 * min(_timed(lambda p=p: engine.generate(p, one), device) for _ in range(2)), 3)
        )
        log(f"prefill {n:5d} tokens: {prefill_ms[-1]:.1f} ms")
    decode_ms = []
    for b in cfg.decode_batch:
        row = []
        for c in cfg.decode_context:
            params = SamplingParams(max_tokens=extra, temperature=0, ignore_eos=True)
            ids = [engine.add_request(p, params) for p in prompts(b, c)]
            while any(
                (r := engine.request(rid)) is not None and r.num_output_tokens == 0
                for rid in engine.request_ids()
            ):
                engine.step()
            engine.step()  # every request decoding
            assert len(engine.request_ids(RequestStatus.RUNNING)) == b, "the batch shrank before timing"
            t = _timed(lambda: [engine.step() for _ in range(cfg.steps)], device)
            for rid in ids:
                engine.abort(rid)
            while engine.has_unfinished():
                engine.step()
            row.append(round(1000 * t / cfg.steps, 3))
            log(f"decode batch {b:3d} context {c:5d}: {row[-1]:.1f} ms a step")
        decode_ms.append(tuple(row))
    if cfg.memory_bytes:
        memory = cfg.memory_bytes
    elif device.type == "cuda":
        memory = torch.cuda.get_device_properties(device).total_memory
    else:
        memory = int(weights.layout.nbytes + 8192 * per_token / 0.9)
    name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"cpu ({torch.get_num_threads()} threads)"
    )
    return Profile(
        name=f"{cfg.model.removeprefix('random:')}-{'cpu' if device.type == 'cpu' else 'cuda'}",
        device=name,
        note=f"measured by `blitzscale profile --model {cfg.model} --device {cfg.device}`"
        f" (torch {torch.__version__})",
        weight_bytes=weights.layout.nbytes,
        kv_bytes_per_token=per_token,
        device_memory_bytes=memory,
        num_layers=mc.num_layers,
        prefill_tokens=cfg.prefill_tokens,
        prefill_ms=tuple(prefill_ms),
        decode_batch=cfg.decode_batch,
        decode_context=cfg.decode_context,
        decode_ms=tuple(decode_ms),
    )
