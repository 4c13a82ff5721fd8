"""Engine speed next to Hugging Face transformers and the HBM roofline, in one run.

- correctness: our logits vs transformers' on the same weights (shared memory, no copy);
- decode ms per step at several batch sizes, for us and for HF `generate`;
- time to prefill `prefill_len` tokens, for us and for one HF forward;
- roofline: weight bytes / (device copy bandwidth measured now).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from blitzscale.checkpoint import load_weights, resolve_model
from blitzscale.checkpoint.pack import hf_state_dict
from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.engine.engine import default_dtype
from blitzscale.model.weights import ModelWeights


@dataclass(frozen=True)
class EngineBenchConfig:
    model: str = "random:llama3-8b"
    device: str = "cuda"
    batch_sizes: tuple[int, ...] = (1, 8, 32)
    prompt_len: int = 128
    decode_steps: int = 32
    prefill_len: int = 2048
    with_hf: bool = True
    block_size: int = 64


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], device: torch.device) -> float:
    _sync(device)
    t = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 31, reps: int = 5) -> float:
    """Bytes moved (read + written) per second by a large device-to-device copy."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(_timed(lambda: dst.copy_(src), device) for _ in range(reps))
    return 2 * nbytes / best


def _random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, length), generator=g).tolist()


def _engine(weights: ModelWeights, cfg: EngineBenchConfig, max_seqs: int) -> LLMEngine:
    tokens = max(max_seqs * (cfg.prompt_len + cfg.decode_steps + 2), cfg.prefill_len + 2)
    blocks = -(-tokens // cfg.block_size) + max_seqs
    return LLMEngine(
        weights,
        None,
        EngineConfig(
            block_size=cfg.block_size,
            num_kv_blocks=blocks,
            max_num_batched_tokens=max(max_seqs * cfg.prompt_len, cfg.prefill_len),
            max_num_seqs=max_seqs,
            max_model_len=cfg.prefill_len + cfg.decode_steps + 8,
        ),
    )


def _decode_ms(engine: LLMEngine, cfg: EngineBenchConfig, batch: int, device: torch.device) -> float:
    params = SamplingParams(max_tokens=cfg.decode_steps + 2, temperature=0, ignore_eos=True)
    for p in _random_prompts(batch, cfg.prompt_len, engine.model_config.vocab_size, batch):
        engine.add_request(p, params)
    engine.step()  # prefill of the whole batch
    engine.step()  # first decode (warm)
    t = _timed(lambda: [engine.step() for _ in range(cfg.decode_steps)], device)
    while engine.has_unfinished():
        engine.step()
    return 1000 * t / cfg.decode_steps


def _prefill_ms(engine: LLMEngine, cfg: EngineBenchConfig, device: torch.device) -> float:
    prompt = _random_prompts(1, cfg.prefill_len, engine.model_config.vocab_size, 7)[0]
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    engine.generate([prompt], params)  # warm-up
    return 1000 * _timed(lambda: engine.generate([prompt], params), device)


def _hf_model(weights: ModelWeights) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    d = weights.config.to_hf()
    hf_cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    with torch.device(weights.device):  # (meta would leave the rotary buffers empty)
        model = AutoModelForCausalLM.from_config(hf_cfg, dtype=weights.dtype)
    model.load_state_dict(hf_state_dict(weights), strict=False, assign=True)  # share our memory
    model.tie_weights()
    return model.eval()


@torch.inference_mode()
def _compare_logits(engine: LLMEngine, hf: torch.nn.Module, device: torch.device) -> dict[str, float]:
    from blitzscale.kvcache.cache import KVCache
    from blitzscale.model.attention import AttentionMetadata

    ids = _random_prompts(1, 64, engine.model_config.vocab_size, 3)[0]
    kv = KVCache(engine.model_config, 2, 64, engine.kv_cache.data.dtype, device)
    meta = AttentionMetadata.build([64], [64], [[0]], 64, device)
    ours = engine.model.forward(torch.tensor(ids, device=device), meta, kv).float()
    ref = hf(torch.tensor([ids], device=device)).logits[0].float()
    return {
        "max_abs_diff": float((ours - ref).abs().max()),
        "ref_max_abs": float(ref.abs().max()),
        "top1_agreement": float((ours.argmax(-1) == ref.argmax(-1)).float().mean()),
        "cosine_min": float(torch.nn.functional.cosine_similarity(ours, ref, dim=-1).min()),
    }


@torch.inference_mode()
def _hf_decode_ms(hf: torch.nn.Module, cfg: EngineBenchConfig, batch: int, vocab: int, device) -> float:
    ids = torch.tensor(_random_prompts(batch, cfg.prompt_len, vocab, batch), device=device)
    kw = {"do_sample": False, "pad_token_id": 0}

    def gen(n: int) -> None:
        hf.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)

    gen(2)
    one = _timed(lambda: gen(1), device)
    full = _timed(lambda: gen(cfg.decode_steps + 1), device)
    return 1000 * (full - one) / cfg.decode_steps


@torch.inference_mode()
def _hf_prefill_ms(hf: torch.nn.Module, cfg: EngineBenchConfig, vocab: int, device) -> float:
    ids = torch.tensor(_random_prompts(1, cfg.prefill_len, vocab, 7), device=device)
    hf(ids, logits_to_keep=1)
    return 1000 * _timed(lambda: hf(ids, logits_to_keep=1), device)


def run_engine_bench(cfg: EngineBenchConfig) -> dict[str, Any]:
    device = torch.device(cfg.device)
    dtype = default_dtype(device)
    t0 = time.perf_counter()
    weights = load_weights(resolve_model(cfg.model), dtype=dtype, device=device)
    build_s = time.perf_counter() - t0
    bw = copy_bandwidth(device) if device.type == "cuda" else None
    result: dict[str, Any] = {
        "config": asdict(cfg),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "dtype": str(dtype),
        "weight_bytes": weights.layout.nbytes,
        "build_s": round(build_s, 3),
    }
    if bw is not None:
        result["copy_bandwidth_GBps"] = round(bw / 1e9, 1)
        # A decode step must read every weight once: HBM moves `bw` bytes/s in all.
        result["roofline_decode_ms"] = round(1000 * weights.layout.nbytes / bw, 3)
    engine = _engine(weights, cfg, max(cfg.batch_sizes))
    hf = _hf_model(weights) if cfg.with_hf else None
    if hf is not None:
        result["logits_vs_hf"] = _compare_logits(engine, hf, device)
    vocab = weights.config.vocab_size
    result["decode_ms_per_step"] = {}
    result["hf_decode_ms_per_step"] = {}
    for b in cfg.batch_sizes:
        result["decode_ms_per_step"][str(b)] = round(_decode_ms(engine, cfg, b, device), 3)
        if hf is not None:
            result["hf_decode_ms_per_step"][str(b)] = round(_hf_decode_ms(hf, cfg, b, vocab, device), 3)
    result["prefill_ms"] = round(_prefill_ms(engine, cfg, device), 3)
    if hf is not None:
        result["hf_prefill_ms"] = round(_hf_prefill_ms(hf, cfg, vocab, device), 3)
    result["kv_blocks_free_at_end"] = engine.pool.num_free_blocks == engine.pool.num_blocks
    return result
