"""Engine speed next to Hugging Face transformers and the device's limits, in one run.

- correctness: our logits vs transformers' on the same weights (shared memory, no copy);
- decode ms per step at several batch sizes and context lengths (CUDA graphs on a GPU), for
  us, and for HF `generate` at the first context length; a few eager steps for comparison;
- decode roofline: (weight bytes + KV bytes read) / device copy bandwidth measured now;
- time to prefill `prefill_len` tokens, for us and for one HF forward, and the bf16 FLOP
  bound: the prefill's matmul and attention FLOPs / a large bf16 matmul's rate measured now;
- a live target: time from its last weight segment landing to its first decode step's end.

With `dtype="fp8"` (`bench engine --dtype fp8`) it measures instead the model with FP8
linears beside the bf16 model of the same weights dequantized, in one run: logits of one
against the other, decode ms per step, prefill ms, weight bytes, and the FP8/bf16 ratios.
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
from blitzscale.model.llama import LlamaModel
from blitzscale.model.weights import ModelWeights


@dataclass(frozen=True)
class EngineBenchConfig:
    model: str = "random:llama3-8b"
    device: str = "cuda"
    batch_sizes: tuple[int, ...] = (1, 8, 32, 64)
    context_lens: tuple[int, ...] = (512, 2048)
    decode_steps: int = 32
    prefill_len: int = 2048
    with_hf: bool = True
    block_size: int = 64
    dtype: str = "bf16"  # "bf16", or "fp8": FP8 linears beside bf16, both measured


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


def matmul_flops(device: torch.device, n: int = 8192, reps: int = 10) -> float:
    """bf16 FLOP/s of an n x n x n matmul on random data (mean of `reps` after a warm-up)."""
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    for _ in range(3):
        a @ b
    t = _timed(lambda: [a @ b for _ in range(reps)], device)
    return 2 * n**3 * reps / t


def prefill_flops(weights: ModelWeights, tokens: int) -> float:
    """Matmul FLOPs of one prompt of `tokens`: every layer's projections, causal attention
    (QK^T and PV over the lower triangle), and the head for the last token only."""
    cfg = weights.config
    per_token = sum(t.numel() for w in weights.layers for t in (w.qkv, w.o, w.gate_up, w.down))
    attention = 2 * 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * tokens * (tokens + 1) / 2
    return 2 * per_token * tokens + attention + 2 * weights.lm_head.numel()


def kv_bytes_per_token(weights: ModelWeights) -> int:
    cfg = weights.config
    return cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * weights.buffer.element_size()


def _random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, length), generator=g).tolist()


def _engine(weights: ModelWeights, cfg: EngineBenchConfig, max_seqs: int) -> LLMEngine:
    longest = max(*cfg.context_lens, cfg.prefill_len)
    tokens = max(max_seqs * (max(cfg.context_lens) + cfg.decode_steps + 2), cfg.prefill_len + 2)
    blocks = -(-tokens // cfg.block_size) + 2 * max_seqs
    return LLMEngine(
        weights,
        None,
        EngineConfig(
            block_size=cfg.block_size,
            num_kv_blocks=blocks,
            max_num_batched_tokens=max(8192, cfg.prefill_len),
            max_num_seqs=max_seqs,
            max_model_len=longest + 2 * cfg.decode_steps + 64,
        ),
    )


def _decode_ms(
    engine: LLMEngine,
    cfg: EngineBenchConfig,
    batch: int,
    context: int,
    device: torch.device,
    steps: int,
    gpu_ms: list[float] | None = None,
) -> float:
    # Long enough that no request ends before the timed steps do; aborted after them.
    params = SamplingParams(max_tokens=2 * steps + 40, temperature=0, ignore_eos=True)
    prompts = _random_prompts(batch, context, engine.model_config.vocab_size, batch * 100_003 + context)
    ids = [engine.add_request(p, params) for p in prompts]
    while any(engine.request(r).num_output_tokens == 0 for r in engine.request_ids()):  # type: ignore[union-attr]
        engine.step()  # the prompts (several mixed prefill + decode steps when long)
    engine.step()  # first decode of all (warm)
    t = _timed(lambda: [engine.step() for _ in range(steps)], device)
    graphs = engine.runner.graphs
    if gpu_ms is not None and graphs is not None and graphs.bucket_for(batch) is not None:
        # The same step's graph alone, replayed on the last step's inputs: the GPU's share
        # of a step (the rest is the engine's CPU work between steps).
        g = graphs.graphs[graphs.bucket_for(batch)]  # type: ignore[index]
        gpu_ms.append(1000 * _timed(lambda: [g.replay() for _ in range(10)], device) / 10)
    for rid in ids:
        engine.abort(rid)
    while engine.has_unfinished():
        engine.step()
    return 1000 * t / steps


PREFILL_REPS = 3
CACHED_SHARE = 0.75  # of the prompt, the prefix a request before it left in the cache


def _best_first_token_ms(
    engine: LLMEngine, device: torch.device, pair: Callable[[int], tuple[list[int], list[int]]]
) -> float:
    """The best of PREFILL_REPS times to the first token: each time on an empty prefix cache,
    `pair(rep)`'s first prompt run, then its second one timed."""
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    best = float("inf")
    for rep in range(PREFILL_REPS):
        engine.reset_prefix_cache()  # (nothing of an earlier call's prompts)
        before, timed = pair(rep)
        engine.generate([before], params)
        best = min(best, _timed(lambda p=timed: engine.generate([p], params), device))
    return 1000 * best


def _prefill_ms(engine: LLMEngine, cfg: EngineBenchConfig, device: torch.device) -> float:
    """One prompt of `prefill_len` to its first token, after a warm-up on another prompt (the
    same one again would come from the prefix cache)."""
    vocab = engine.model_config.vocab_size

    def pair(rep: int) -> tuple[list[int], list[int]]:
        warm, prompt = _random_prompts(2, cfg.prefill_len, vocab, 7 + rep)
        return warm, prompt

    return _best_first_token_ms(engine, device, pair)


def _prefill_cached_ms(engine: LLMEngine, cfg: EngineBenchConfig, device: torch.device) -> float:
    """The same length, with its first CACHED_SHARE already cached by another request."""
    if not engine.config.prefix_caching:
        return float("nan")
    vocab = engine.model_config.vocab_size
    head = int(cfg.prefill_len * CACHED_SHARE)

    def pair(rep: int) -> tuple[list[int], list[int]]:
        first, second = _random_prompts(2, cfg.prefill_len, vocab, 8 + rep)
        second[:head] = first[:head]
        return first, second

    return _best_first_token_ms(engine, device, pair)


def _hf_model(weights: ModelWeights) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    d = weights.config.to_hf()
    hf_cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    with torch.device(weights.device):  # (meta would leave the rotary buffers empty)
        model = AutoModelForCausalLM.from_config(hf_cfg, dtype=weights.dtype)
    model.load_state_dict(hf_state_dict(weights), strict=False, assign=True)  # share our memory
    model.tie_weights()
    return model.eval()


def _logit_stats(ours: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    return {
        "max_abs_diff": float((ours - ref).abs().max()),
        "ref_max_abs": float(ref.abs().max()),
        "top1_agreement": float((ours.argmax(-1) == ref.argmax(-1)).float().mean()),
        "cosine_min": float(torch.nn.functional.cosine_similarity(ours, ref, dim=-1).min()),
        "cosine_mean": float(torch.nn.functional.cosine_similarity(ours, ref, dim=-1).mean()),
        "cosine_all": float(torch.nn.functional.cosine_similarity(ours.flatten(), ref.flatten(), dim=0)),
    }


def _probe_ids(engine: LLMEngine) -> list[int]:
    return _random_prompts(1, 64, engine.model_config.vocab_size, 3)[0]


@torch.inference_mode()
def _our_logits(model: LlamaModel, engine: LLMEngine, device: torch.device) -> torch.Tensor:
    from blitzscale.kvcache.cache import KVCache
    from blitzscale.model.attention import AttentionMetadata

    kv = KVCache(engine.model_config, 2, 64, engine.kv_cache.data.dtype, device)
    meta = AttentionMetadata.build([64], [64], [[0]], 64, device)
    return model.forward(torch.tensor(_probe_ids(engine), device=device), meta, kv).float()


@torch.inference_mode()
def _hf_logits(hf: torch.nn.Module, engine: LLMEngine, device: torch.device) -> torch.Tensor:
    return hf(torch.tensor([_probe_ids(engine)], device=device)).logits[0].float()


def _compare_logits(
    model: LlamaModel, engine: LLMEngine, hf: torch.nn.Module, device: torch.device
) -> dict[str, float]:
    return _logit_stats(_our_logits(model, engine, device), _hf_logits(hf, engine, device))


@torch.inference_mode()
def _vs_fp32(weights: ModelWeights, engine: LLMEngine, hf: torch.nn.Module, device) -> dict[str, Any]:
    """Both bf16 paths (ours, HF's) against HF run in fp32 on the same weights: which is
    nearer the exact answer (bf16 paths differ from each other by their rounding)."""
    hf32 = _hf_model(weights).float()  # new fp32 tensors; our bf16 buffer is untouched
    exact = _hf_logits(hf32, engine, device)
    del hf32
    torch.cuda.empty_cache()
    ref = LlamaModel(weights, max_positions=engine.max_model_len, backend="reference")
    return {
        "ours": _logit_stats(_our_logits(engine.model, engine, device), exact),
        "reference_backend": _logit_stats(_our_logits(ref, engine, device), exact),
        "hf_bf16": _logit_stats(_hf_logits(hf, engine, device), exact),
    }


@torch.inference_mode()
def _hf_decode_ms(
    hf: torch.nn.Module, cfg: EngineBenchConfig, batch: int, context: int, vocab: int, device
) -> float:
    ids = torch.tensor(_random_prompts(batch, context, vocab, batch), device=device)
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


@torch.inference_mode()
def _live_first_decode(
    weights: ModelWeights, cfg: EngineBenchConfig, device: torch.device
) -> dict[str, float]:
    """A live target on the same memory: built (graphs captured) before any segment lands,
    one request admitted, segments landing one by one with a step after each; then the
    time from the last segment landing to the end of the request's first decode step."""
    live = ModelWeights(weights.config, weights.layout, weights.buffer)  # nothing landed yet
    t = time.perf_counter()
    engine = LLMEngine(
        live,
        None,
        EngineConfig(
            block_size=cfg.block_size,
            num_kv_blocks=64,
            max_num_seqs=max(cfg.batch_sizes),
            max_model_len=max(cfg.context_lens) + 2 * cfg.decode_steps + 64,
        ),
    )
    build_s = time.perf_counter() - t
    engine.start_live()
    prompt = _random_prompts(1, 128, weights.config.vocab_size, 11)[0]
    rid = engine.add_request(prompt, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    segments = live.readiness.num_segments
    for seg in range(segments - 1):
        live.readiness.add(seg)
        engine.step()
    _sync(device)
    t = time.perf_counter()
    live.readiness.add(segments - 1)  # the last segment (the head) lands
    tokens = 0
    while tokens < 2:  # the prompt's first token, then the first decode step's
        tokens += sum(len(o.new_token_ids) for o in engine.step() if o.request_id == rid)
    _sync(device)
    ms = 1000 * (time.perf_counter() - t)
    engine.abort(rid)
    engine.step()
    return {
        "engine_build_before_weights_s": round(build_s, 3),
        "last_segment_to_first_decode_ms": round(ms, 3),
    }


def _free(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _speed(weights: ModelWeights, cfg: EngineBenchConfig, device: torch.device) -> dict[str, Any]:
    """One model's decode and prefill times, its weight bytes and its linear path."""
    engine = _engine(weights, cfg, max(cfg.batch_sizes))
    c = cfg.context_lens[0]
    step_ms, gpu_ms = {}, {}
    for b in cfg.batch_sizes:
        graph: list[float] = []
        step_ms[str(b)] = round(_decode_ms(engine, cfg, b, c, device, cfg.decode_steps, graph), 3)
        if graph:
            gpu_ms[str(b)] = round(graph[0], 3)
    out: dict[str, Any] = {
        "weight_bytes": weights.layout.nbytes,
        "linear": engine.model.linear.name,
        "cuda_graph_buckets": engine.runner.graphs.buckets if engine.runner.graphs else [],
        "decode_context": c,
        "decode_ms_per_step": step_ms,
        # the step's CUDA graph alone (the GPU's share; the rest is the engine's host work,
        # which overlaps the GPU's where it can)
        "decode_graph_ms": gpu_ms,
        "prefill_len": cfg.prefill_len,
        "prefill_ms": round(_prefill_ms(engine, cfg, device), 3),
    }
    del engine
    _free(device)
    return out


def fp8_and_dequantized(
    model: str, device: torch.device, dtype: torch.dtype
) -> tuple[ModelWeights, ModelWeights]:
    """`model`'s weights in FP8, and the unquantized model (activations in `dtype`) holding
    the same weights dequantized: the pair every FP8-against-bf16 measurement compares."""
    from dataclasses import replace

    from blitzscale.checkpoint.pack import pack_into

    fp8 = load_weights(resolve_model(model), dtype=dtype, device=device, quant="fp8")
    dense = ModelWeights.empty(replace(fp8.config, quant="none"), dtype, device)
    pack_into(dense, hf_state_dict(fp8).__getitem__)
    return fp8, dense


def run_fp8_engine_bench(cfg: EngineBenchConfig) -> dict[str, Any]:
    """FP8 linears (`torch._scaled_mm` on Hopper) against the bf16 model holding the same
    weights dequantized: logits agreement and speed, in one run on one device."""
    device = torch.device(cfg.device)
    dtype = default_dtype(device)
    t0 = time.perf_counter()
    fp8, dense = fp8_and_dequantized(cfg.model, device, dtype)
    result: dict[str, Any] = {
        "config": asdict(cfg),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "activation_dtype": str(dtype),
        "build_s": round(time.perf_counter() - t0, 3),
    }
    probe = _engine(fp8, cfg, 1)
    ours = _our_logits(probe.model, probe, device)
    ref = _our_logits(LlamaModel(dense, max_positions=probe.max_model_len), probe, device)
    result["fp8_logits_vs_dense_dequantized"] = _logit_stats(ours, ref)
    del probe
    _free(device)
    result["dense"] = _speed(dense, cfg, device)
    result["fp8"] = _speed(fp8, cfg, device)
    b16, f8 = result["dense"], result["fp8"]
    result["fp8_over_dense"] = {
        "weight_bytes": round(f8["weight_bytes"] / b16["weight_bytes"], 3),
        "decode_ms_per_step": {
            b: round(f8["decode_ms_per_step"][b] / b16["decode_ms_per_step"][b], 3)
            for b in b16["decode_ms_per_step"]
        },
        "decode_graph_ms": {
            b: round(f8["decode_graph_ms"][b] / b16["decode_graph_ms"][b], 3)
            for b in b16["decode_graph_ms"]
            if b in f8["decode_graph_ms"]
        },
        "prefill_ms": round(f8["prefill_ms"] / b16["prefill_ms"], 3),
    }
    return result


def run_engine_bench(cfg: EngineBenchConfig) -> dict[str, Any]:
    if cfg.dtype not in ("bf16", "fp8"):
        raise ValueError(f"bench engine: unknown dtype {cfg.dtype!r}; use bf16 or fp8")
    if cfg.dtype == "fp8":
        return run_fp8_engine_bench(cfg)
    device = torch.device(cfg.device)
    dtype = default_dtype(device)
    t0 = time.perf_counter()
    weights = load_weights(resolve_model(cfg.model), dtype=dtype, device=device)
    build_s = time.perf_counter() - t0
    cuda = device.type == "cuda"
    bw = copy_bandwidth(device) if cuda else None
    flops = matmul_flops(device) if cuda else None
    result: dict[str, Any] = {
        "config": asdict(cfg),
        "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__,
        "dtype": str(dtype),
        "weight_bytes": weights.layout.nbytes,
        "kv_bytes_per_token": kv_bytes_per_token(weights),
        "build_s": round(build_s, 3),
    }
    t0 = time.perf_counter()
    engine = _engine(weights, cfg, max(cfg.batch_sizes))
    result["engine_build_s"] = round(time.perf_counter() - t0, 3)  # includes graph capture
    result["attention_backend"] = engine.model.attn.name
    result["cuda_graph_buckets"] = engine.runner.graphs.buckets if engine.runner.graphs else []
    hf = _hf_model(weights) if cfg.with_hf else None
    if hf is not None:
        result["logits_vs_hf"] = _compare_logits(engine.model, engine, hf, device)
        if engine.model.attn.name != "reference":  # the reference path on the same weights
            ref = LlamaModel(weights, max_positions=engine.max_model_len, backend="reference")
            result["logits_vs_hf_reference_backend"] = _compare_logits(ref, engine, hf, device)
            for attn, ops in (("reference", "triton"), ("triton", "torch")):  # which part differs
                m = LlamaModel(weights, max_positions=engine.max_model_len, backend=attn, ops=ops)
                result[f"logits_vs_hf_{attn}_attention_{ops}_ops"] = _compare_logits(m, engine, hf, device)
        if cuda:
            result["logits_vs_hf_fp32"] = _vs_fp32(weights, engine, hf, device)
    vocab = weights.config.vocab_size
    steps = cfg.decode_steps
    decode: dict[str, dict[str, float]] = {}
    replay: dict[str, dict[str, float]] = {}
    roof: dict[str, dict[str, float]] = {}
    ratio: dict[str, dict[str, float]] = {}
    for ctx in cfg.context_lens:
        c = str(ctx)
        decode[c], roof[c], ratio[c], replay[c] = {}, {}, {}, {}
        for b in cfg.batch_sizes:
            gpu: list[float] = []
            ms = _decode_ms(engine, cfg, b, ctx, device, steps, gpu)
            decode[c][str(b)] = round(ms, 3)
            if gpu:
                replay[c][str(b)] = round(gpu[0], 3)
            if bw is not None:
                # Each step reads every weight once and the KV of every sequence (its
                # context grows from ctx + 1 to ctx + steps over the timed steps).
                kv = b * (ctx + 1 + steps / 2) * result["kv_bytes_per_token"]
                roof[c][str(b)] = round(1000 * (weights.layout.nbytes + kv) / bw, 3)
                ratio[c][str(b)] = round(ms / roof[c][str(b)], 3)
    result["decode_ms_per_step"] = decode
    if any(replay.values()):
        result["graph_replay_ms"] = replay
    if bw is not None:
        result["copy_bandwidth_GBps"] = round(bw / 1e9, 1)
        result["roofline_decode_ms"] = roof
        result["decode_vs_roofline"] = ratio
    if engine.overlap is not None:  # the same steps, each step's tokens read before the next
        result["overlapped_steps"] = engine.overlap.steps
        kept, engine.overlap = engine.overlap, None
        result["no_overlap_decode_ms_per_step"] = {
            str(c): {str(b): round(_decode_ms(engine, cfg, b, c, device, steps), 3) for b in cfg.batch_sizes}
            for c in cfg.context_lens
        }
        engine.overlap = kept
    graphs = engine.runner.graphs
    if graphs is not None:  # the same steps without graphs, at the first context length
        engine.runner.graphs = None
        c = cfg.context_lens[0]
        result["eager_decode_ms_per_step"] = {
            str(c): {str(b): round(_decode_ms(engine, cfg, b, c, device, 8), 3) for b in cfg.batch_sizes}
        }
        engine.runner.graphs = graphs
    if hf is not None:
        c = cfg.context_lens[0]
        result["hf_decode_ms_per_step"] = {
            str(c): {str(b): round(_hf_decode_ms(hf, cfg, b, c, vocab, device), 3) for b in cfg.batch_sizes}
        }
    result["prefill_ms"] = round(_prefill_ms(engine, cfg, device), 3)
    # the same length with its first 3/4 in the prefix cache (NaN with prefix caching off)
    result["prefill_cached_ms"] = round(_prefill_cached_ms(engine, cfg, device), 3)
    result["prefill_cached_share"] = CACHED_SHARE
    result["prefill_cached_ratio"] = round(result["prefill_cached_ms"] / result["prefill_ms"], 3)
    prefill_graphs = engine.runner.prefill_graphs
    if prefill_graphs is not None:  # the cached case again, its chunk run eagerly
        engine.runner.prefill_graphs = None
        result["prefill_cached_ms_eager"] = round(_prefill_cached_ms(engine, cfg, device), 3)
        engine.runner.prefill_graphs = prefill_graphs
        result["prefill_graph_buckets"] = prefill_graphs.buckets
    result["graph_capture_s"] = {k: round(v, 3) for k, v in engine.runner.capture_s.items()}
    attn = engine.model.attn
    if hasattr(attn, "fresh_prefill"):  # the paged Triton prefill kernel instead of SDPA's
        attn.fresh_prefill, kept = "triton", attn.fresh_prefill
        result["prefill_ms_triton_kernel"] = round(_prefill_ms(engine, cfg, device), 3)
        attn.fresh_prefill = kept
    if flops is not None:
        result["bf16_matmul_TFLOPs"] = round(flops / 1e12, 1)
        result["prefill_flop_bound_ms"] = round(1000 * prefill_flops(weights, cfg.prefill_len) / flops, 3)
        result["prefill_vs_flop_bound"] = round(result["prefill_ms"] / result["prefill_flop_bound_ms"], 3)
    if hf is not None:
        result["hf_prefill_ms"] = round(_hf_prefill_ms(hf, cfg, vocab, device), 3)
    result["kv_blocks_free_at_end"] = engine.pool.num_free_blocks == engine.pool.num_blocks
    if cuda:
        result["live_target"] = _live_first_decode(weights, cfg, device)
    return result
