"""FP8 linears on a Hopper GPU (sm_89+): per-token activation quantization (Triton) and
`torch._scaled_mm` with rowwise scales, against the bf16 model of the same weights
dequantized; inside the decode CUDA graphs; and `bench engine --dtype fp8` end to end.

Llama-3-8B-shaped layers (hidden 4096, intermediate 14336, 32/8 heads), random weights.
Run on the GPU machine: `python3 -m pytest tests/gpu/test_cuda_fp8.py -q`.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from blitzscale.checkpoint.loader import random_weights
from blitzscale.checkpoint.pack import hf_state_dict, pack_into
from blitzscale.checkpoint.presets import preset_config
from blitzscale.kvcache.cache import KVCache
from blitzscale.model import LlamaModel
from blitzscale.model.attention import AttentionMetadata
from blitzscale.model.linear import dequantize_rows, quantize_rows, quantize_tokens_torch
from blitzscale.model.weights import ModelWeights

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(
        torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
        reason="FP8 matmuls need sm_89 or later",
    ),
]

LAYERS = 8  # Llama-3-8B's layers, fewer of them (the test's time and memory)


def fp8_model(layers: int = LAYERS) -> ModelWeights:
    cfg = replace(preset_config("llama3-8b:fp8"), num_layers=layers)
    return random_weights(cfg, torch.bfloat16, "cuda", seed=5)


def dequantized(w8: ModelWeights) -> ModelWeights:
    dense = ModelWeights.empty(replace(w8.config, quant="none"), torch.bfloat16, "cuda")
    pack_into(dense, hf_state_dict(w8).__getitem__)
    return dense


@pytest.mark.parametrize("shape", [(1, 4096), (7, 14336), (64, 4096), (3, 100)])
@torch.inference_mode()
def test_triton_token_quantization_equals_the_torch_reference(shape: tuple[int, int]) -> None:
    from blitzscale.model.triton_ops import quantize_tokens

    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 3
    x[0, :5] = 0
    if shape[0] > 2:
        x[2] = 0  # a zero row: scale at its floor, zeros out
    q, s = quantize_tokens(x)
    q_ref, s_ref = quantize_tokens_torch(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (shape[0], 1) and s.dtype == torch.float32
    assert torch.equal(s, s_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


@torch.inference_mode()
def test_scaled_mm_linear_is_close_to_the_dequantized_matmul() -> None:
    from blitzscale.model.linear import select_linear

    linear = select_linear(torch.device("cuda"), torch.bfloat16, "fp8")
    assert linear.name == "scaled_mm"
    w = torch.randn(6144, 4096, device="cuda") * 0.02
    q, s = quantize_rows(w)
    x = torch.randn(33, 4096, device="cuda", dtype=torch.bfloat16)
    out = linear(x, q, s)
    ref = x.float() @ dequantize_rows(q, s, torch.float32).t()
    assert out.dtype == torch.bfloat16 and out.shape == (33, 6144)
    cos = torch.nn.functional.cosine_similarity(out.float(), ref, dim=-1)
    assert float(cos.min()) >= 0.995
    assert linear(x[:0], q, s).shape == (0, 6144)


class ActivationFakeQuant:
    """The reference of the FP8 matmul's numbers: activations quantized per token and both
    operands dequantized (exact products of the same FP8 values), an fp32 matmul, rounded
    to the activation dtype; what `_scaled_mm` computes up to its accumulation order."""

    name = "fakequant"

    def takes_quantized(self, rows: int) -> bool:
        return False

    def __call__(self, x, weight, scale, bias=None, raw=False):  # type: ignore[no-untyped-def]
        xq, xs = quantize_tokens_torch(x.contiguous())
        w = dequantize_rows(weight, scale, torch.float32)
        out = ((xq.float() * xs) @ w.t()).to(x.dtype)
        return out if bias is None else out + bias


def _logits(w: ModelWeights, ids: torch.Tensor, linear: object | None = None) -> tuple[torch.Tensor, str]:
    model = LlamaModel(w, max_positions=1024)
    if linear is not None:
        model.linear = linear
    kv = KVCache(w.config, 4, 64, torch.bfloat16, "cuda")
    n = ids.numel()
    meta = AttentionMetadata.build([n], [n], [[3, 1]], 64, "cuda")
    return model.forward(ids, meta, kv).float(), model.linear.name


@pytest.mark.parametrize("n", [5, 64])
@torch.inference_mode()
def test_the_rotary_kernel_scaling_the_qkv_product_gives_the_same_bits(n: int) -> None:
    """Steps of 2-64 rows leave the FP8 qkv product unscaled and the attention's rotary
    kernel applies its scales as it reads q, k and v (`LlamaModel.fuse_qkv_scales`): the
    logits must be the bits of the separate scale pass, for a prompt (whose attention reads
    q, k and v where the kernel left them) and for a decode step after it."""

    def run(fused: bool) -> tuple[torch.Tensor, torch.Tensor]:
        model = LlamaModel(w8, max_positions=1024)
        assert model.fuse_qkv_scales and model.linear.takes_quantized(n)
        model.fuse_qkv_scales = fused
        kv = KVCache(w8.config, 4, 64, torch.bfloat16, "cuda")
        prompt = model.forward(ids, AttentionMetadata.build([n], [n], [[3, 1]], 64, "cuda"), kv)
        # the prompt's next token, and a new one-token sequence beside it (2 rows)
        step = AttentionMetadata.build([1, 1], [n + 1, 1], [[3, 1], [2]], 64, "cuda")
        return prompt.float(), model.forward(ids[-2:], step, kv).float()

    w8 = fp8_model()
    ids = torch.randint(0, w8.config.vocab_size, (n,), generator=torch.Generator().manual_seed(2)).cuda()
    (p_fused, d_fused), (p_ref, d_ref) = run(True), run(False)
    assert torch.equal(p_fused, p_ref) and torch.equal(d_fused, d_ref)


@torch.inference_mode()
def test_fp8_model_computes_what_its_quantization_gives() -> None:
    """The FP8 path (Triton quantization, `_scaled_mm`) against the same quantization done
    in plain torch, through 8 layers (one linear alone: test_scaled_mm_linear_...)."""
    w8 = fp8_model()
    ids = torch.randint(0, w8.config.vocab_size, (128,), generator=torch.Generator().manual_seed(1)).cuda()
    fp8, name = _logits(w8, ids)
    ref, _ = _logits(w8, ids, ActivationFakeQuant())
    assert name == "scaled_mm"
    cos = torch.nn.functional.cosine_similarity(fp8, ref, dim=-1)
    print(
        f"fp8 vs its torch reference: logits cosine mean {float(cos.mean()):.6f} min {float(cos.min()):.6f}"
    )
    # Not closer: a rounding apart, an activation lands on the next e4m3 value (6% off), and a
    # random network carries that through its layers (H200: mean 0.983, min 0.978 after 8
    # layers); a wrong scale, row or layout gives a cosine far from 1.
    assert float(cos.mean()) >= 0.96 and float(cos.min()) >= 0.94


@torch.inference_mode()
def test_fp8_logits_against_the_bf16_model_of_the_dequantized_weights() -> None:
    """What quantizing the activations costs. On random weights each linear's input loses
    about 3.6% (RMS) to e4m3's three mantissa bits, and a random network carries that noise
    through every layer: the cosine falls with depth (measured on the H200: 0.992 for the
    first position down to 0.96 over 128 positions of 8 layers; 0.90 for the whole random 8B, in
    docs/benchmarks.md). Held here at what 8 layers give, so a wrong scale or layout (a
    cosine near 0) or a regression of the quantization fails."""
    w8 = fp8_model()
    ids = torch.randint(0, w8.config.vocab_size, (128,), generator=torch.Generator().manual_seed(1)).cuda()
    fp8, _ = _logits(w8, ids)
    dense, name = _logits(dequantized(w8), ids)
    assert name == "dense"
    cos = torch.nn.functional.cosine_similarity(fp8, dense, dim=-1)
    print(f"fp8 vs bf16-dequantized logits cosine: mean {float(cos.mean()):.5f} min {float(cos.min()):.5f}")
    assert float(cos.mean()) >= 0.95 and float(cos.min()) >= 0.93  # (H200: 0.969, 0.958)


@torch.inference_mode()
def test_decode_graphs_run_the_fp8_path_as_eager_steps_do() -> None:
    """A decode step replayed from a CUDA graph against the same step run eagerly, on the
    same KV cache: the FP8 linears inside the graph compute what they compute outside it
    (up to the attention's split order, which the graph fixes for the longest context)."""
    from blitzscale.engine.cuda_graphs import DecodeGraphs

    w8 = fp8_model(4)
    model = LlamaModel(w8, max_positions=1024)
    assert model.linear.name == "scaled_mm"
    page = 16
    kv = KVCache(w8.config, 40, page, torch.bfloat16, "cuda")
    graphs = DecodeGraphs(model, kv, max_batch=4, max_model_len=128)
    graphs.capture()
    lens = [5, 30, 64, 100]
    tables = [list(range(1 + 9 * i, 1 + 9 * i + 8)) for i in range(len(lens))]
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, w8.config.vocab_size, (n,), generator=g) for n in lens]
    meta = AttentionMetadata.build(lens, lens, tables, page, "cuda")
    logits = model.forward(torch.cat(prompts).cuda(), meta, kv)
    last = torch.tensor(lens).cumsum(0) - 1
    nxt = logits[last.cuda()].argmax(-1).tolist()
    ctx = [n + 1 for n in lens]
    graphed = graphs.run(nxt, ctx, tables).clone()
    meta = AttentionMetadata.build([1] * 4, ctx, tables, page, "cuda")
    eager = model.forward(torch.tensor(nxt).cuda(), meta, kv).float()
    cos = torch.nn.functional.cosine_similarity(graphed, eager, dim=-1)
    print(f"decode graph vs eager, fp8: logits cosine min {float(cos.min()):.6f}")
    assert float(cos.min()) >= 0.995


@torch.inference_mode()
def test_bench_engine_fp8_measures_both_and_their_ratios() -> None:
    from blitzscale.bench.engine_bench import EngineBenchConfig, run_engine_bench

    cfg = EngineBenchConfig(
        model="random:llama3-8b",
        device="cuda",
        batch_sizes=(1, 64),
        context_lens=(512,),
        decode_steps=8,
        prefill_len=2048,
        dtype="fp8",
    )
    r = run_engine_bench(cfg)
    print(r)
    assert r["fp8"]["linear"] == "scaled_mm" and r["dense"]["linear"] == "dense"
    assert 0.5 < r["fp8_over_dense"]["weight_bytes"] < 0.6
    assert r["fp8_logits_vs_dense_dequantized"]["cosine_mean"] >= 0.8  # 32 random layers: ~0.9
    assert set(r["fp8_over_dense"]["decode_ms_per_step"]) == {"1", "64"}
    assert set(r["fp8_over_dense"]["decode_graph_ms"]) == {"1", "64"}  # both steps are graphs
    assert r["fp8"]["prefill_ms"] > 0 and r["dense"]["prefill_ms"] > 0


@pytest.mark.parametrize("m", [1, 2, 5, 16, 17, 64, 65, 300])
@torch.inference_mode()
def test_each_step_size_takes_its_fp8_path_and_matches_its_reference(m: int) -> None:
    """One row: the weight-only GEMV (model/fp8_matmul.py), against the product of bf16
    activations and the dequantized weights in fp32; 2..W8A8_MAX_ROWS rows: activations
    quantized per token and cuBLAS's FP8 GEMM with the scales applied after; more: rowwise
    `_scaled_mm` with fast accumulation (its partial sums not promoted to fp32: up to 2% of
    the largest output where the others stay under 1%); both against the fp32 product of
    the same FP8 values. The same bits on a second call, whatever the path."""
    from blitzscale.model import fp8_matmul
    from blitzscale.model.linear import select_linear
    from blitzscale.model.triton_ops import quantize_tokens

    linear = select_linear(torch.device("cuda"), torch.bfloat16, "fp8")
    for n, k in ((6144, 4096), (4096, 14336), (48, 256), (40, 1024)):
        if n % 16 and m > fp8_matmul.MAX_ROWS:
            continue  # (FP8 GEMMs take multiples of 16; an odd strip is for the GEMV's masks)
        q, s = quantize_rows(torch.randn(n, k, device="cuda") * 0.02)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        out = linear(x, q, s)
        assert out.shape == (m, n) and out.dtype == torch.bfloat16
        assert fp8_matmul.supports(x, q) == (
            m <= fp8_matmul.MAX_ROWS and k % (4 * fp8_matmul.GEMV_MIN_BLOCK_W) == 0
        )
        if fp8_matmul.supports(x, q):
            ref = x.float() @ (q.float() * s[:, None]).t()  # activations not quantized
        else:
            xq, xs = quantize_tokens(x)
            ref = (xq.float() * xs) @ (q.float() * s[:, None]).t()
        err = (out.float() - ref).abs().max() / ref.abs().max()
        assert float(err) < (0.02 if m > fp8_matmul.W8A8_MAX_ROWS else 0.01), (n, k, float(err))
        assert torch.equal(out, linear(x, q, s))
        cos = torch.nn.functional.cosine_similarity(out.float(), x.float() @ (q.float() * s[:, None]).t(), -1)
        assert float(cos.min()) > 0.99


@torch.inference_mode()
def test_the_gemv_widens_every_e4m3_value_exactly() -> None:
    """The one-row GEMV widens e4m3 by moving bits (model/fp8_matmul.py `e4m3_byte_as_f32`):
    every finite byte, subnormals and both zeros included, at each of a word's four places,
    must come out as its value (a one-hot row picks one weight; unit scales)."""
    from blitzscale.model import fp8_matmul

    every = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    finite = every[~every.float().isnan()]  # 254 values
    # K for the wide strip, and one only the narrow strip divides
    for k in (2 * 4 * fp8_matmul.GEMV_BLOCK_W, 3 * 4 * fp8_matmul.GEMV_MIN_BLOCK_W):
        row = finite.repeat(k // finite.numel() + 1)[:k]
        q = torch.stack([row, row.roll(1), row.roll(2), row.roll(3)]).cuda()
        x = torch.eye(k, dtype=torch.bfloat16, device="cuda")
        ones = torch.ones(4, device="cuda")
        got = torch.cat([fp8_matmul.w8a16_matmul(x[j : j + 1], q, ones) for j in range(k)])
        assert torch.equal(got, q.t().float().to(torch.bfloat16)), k


@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0),
    reason="programmatic dependent launch needs sm_90",
)
@pytest.mark.parametrize("n, k", [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)])
@torch.inference_mode()
def test_a_gemv_launched_early_still_reads_the_row_its_norm_wrote(n: int, k: int) -> None:
    """The GEMV launched with programmatic dependent launch (model/pdl.py) reads its first
    weights while the norm before it runs: inside a CUDA graph replayed with a new input
    each time, every replay must multiply the row that replay's norm wrote (a GEMV that
    did not wait would read the last replay's), and give the bits of the GEMV launched
    the ordinary way; on every Llama-3-8B linear shape."""
    from blitzscale.model import fp8_matmul
    from blitzscale.model.triton_ops import TritonOps

    ops = TritonOps()
    gen = torch.Generator(device="cuda").manual_seed(3)
    q, s = quantize_rows(torch.randn(n, k, device="cuda", generator=gen))
    norm_w = torch.rand(k, device="cuda", generator=gen).to(torch.bfloat16) + 0.5
    inp = torch.zeros(1, k, device="cuda", dtype=torch.bfloat16)
    step = torch.randn(1, k, device="cuda", dtype=torch.bfloat16, generator=gen)

    def gemv(pdl: bool) -> torch.Tensor:
        return fp8_matmul.w8a16_matmul(ops.rms_norm(inp, norm_w, 1e-5), q, s, launch_pdl=pdl)

    gemv(True), gemv(False)  # compiled outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        inp.add_(step)
        out = gemv(True)
    for rep in range(20):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, gemv(False)), (n, k, rep)


@pytest.mark.parametrize("rows", [1, 5, 64, 600])
@torch.inference_mode()
def test_fused_norm_and_silu_quantize_as_the_torch_reference_does(rows: int) -> None:
    """The Triton norm and SiLU kernels that quantize their output (and apply an FP8
    product's scales as they read it) against the torch reference ops: the same scales and
    the same e4m3 bits, the same residual sum."""
    from blitzscale.model.fp8_values import Unscaled
    from blitzscale.model.ops import TorchOps
    from blitzscale.model.triton_ops import TritonOps

    fused, ref = TritonOps(), TorchOps()
    g = torch.Generator(device="cuda").manual_seed(3)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)

    def unscaled(n: int) -> Unscaled:
        xs = torch.rand(rows, 1, device="cuda", generator=g) * 0.01
        return Unscaled(randn(rows, n) * 30, xs, torch.rand(n, device="cuda", generator=g) * 0.01)

    def same(a, b) -> bool:  # type: ignore[no-untyped-def]
        return torch.equal(a.s, b.s) and torch.equal(a.q.view(torch.uint8), b.q.view(torch.uint8))

    h, inter = 4096, 14336
    residual, weight = randn(rows, h), randn(h)
    for delta in (None, randn(rows, h), unscaled(h)):
        (qa, ra), (qb, rb) = (ops.add_rms_norm_quant(delta, residual, weight, 1e-5) for ops in (fused, ref))
        assert same(qa, qb) and torch.equal(ra, rb), type(delta).__name__
    for gate_up in (randn(rows, 2 * inter), unscaled(2 * inter)):
        assert same(fused.silu_mul_quant(gate_up), ref.silu_mul_quant(gate_up)), type(gate_up).__name__


class Unfused:
    """An FP8 model's linears without the fused quantization: each quantizes its own input and
    applies its own scales (what the model ran before the norms and SiLU did it)."""

    name = "unfused"

    def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
        self.inner = inner

    def takes_quantized(self, rows: int) -> bool:
        return False

    def __call__(self, x, weight, scale, bias=None, raw=False):  # type: ignore[no-untyped-def]
        return self.inner(x, weight, scale, bias)


@pytest.mark.parametrize("rows", [2, 24, 64, 128])
@torch.inference_mode()
def test_fused_quantization_gives_the_logits_of_the_unfused_linears(rows: int) -> None:
    """A step of `rows` tokens through the fused path (quantized by the norms and the SiLU,
    o and down products scaled by their readers) and through linears that quantize and
    scale on their own: the same logits, bit for bit."""
    w8 = fp8_model(4)
    ids = torch.randint(0, w8.config.vocab_size, (rows,), generator=torch.Generator().manual_seed(4)).cuda()
    model = LlamaModel(w8, max_positions=1024)
    assert model.linear.takes_quantized(rows) and not model.linear.takes_quantized(1)
    fused, _ = _logits(w8, ids)
    plain, name = _logits(w8, ids, Unfused(model.linear))
    assert name == "unfused"
    assert torch.equal(fused, plain)
