"""Candidate FP8 decode kernels the sweeps measured (issue 32; Triton). Not the product's
kernels (those are model/fp8_matmul.py): what was tried, so the sweeps' figures can be
made again.

- `gemv`: one row, FP8 weights widened to fp32 in registers (a [BLOCK_N, BLOCK_K] fp32
  accumulator, or a per-iteration sum along K: ACC2D), optionally computing SiLU(gate) * up
  of a gate_up row on the fly (ACT; each program recomputes it for all of K: slower);
- `tc`: weights as the dot's first operand (widened in registers to bf16), the step's rows
  as the second: out^T tiles, split along K (slow under Triton 3.6: 2.2x bf16 at 16 rows);
- `w8a8`: FP8 x FP8 on the tensor cores with the per-token and per-channel scales after;
- `tensorwise`: cuBLAS's FP8 GEMM with unit scales, then `scale_rows_cols` (what became
  fp8_matmul.w8a8_matmul).
`DOT` picks the dot's operand type: fp32 under Triton's CPU interpreter (whose bf16 dot is
wrong with numpy 2.2), bf16 / e4m3 on the GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def _act(x_ptr, offs, mask, K, ACT: tl.constexpr):
    """The step's input at `offs`: x itself, or silu(gate) * up of a gate_up row (rounded as
    triton_ops._silu_mul rounds), as fp32."""
    if ACT:
        g = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + offs + K, mask=mask, other=0.0).to(tl.float32)
        a = libdevice.div_rn(g, 1.0 + libdevice.exp(-g)).to(tl.bfloat16).to(tl.float32)
        return (a * u).to(tl.bfloat16)
    else:
        return tl.load(x_ptr + offs, mask=mask, other=0.0)


@triton.jit(do_not_specialize=["stride_x"])
def gemv(
    x_ptr, w_ptr, s_ptr, out_ptr, N, K, stride_x,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ACC2D: tl.constexpr, STAGES: tl.constexpr,
    ACT: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    wp = w_ptr + rn[:, None].to(tl.int64) * K + rk[None, :]
    if ACC2D:
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    else:
        acc1 = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = _act(x_ptr, k0 + rk, rk < BLOCK_K, K, ACT).to(tl.float32)
        w = tl.load(wp + k0, mask=n_ok[:, None], other=0.0).to(tl.float32)
        if ACC2D:
            acc2 += w * x[None, :]
        else:
            acc1 += tl.sum(w * x[None, :], axis=1)
    s = tl.load(s_ptr + rn, mask=n_ok, other=0.0)
    out = tl.sum(acc2, axis=1) * s if ACC2D else acc1 * s
    tl.store(out_ptr + rn, out.to(out_ptr.dtype.element_ty), mask=n_ok)


@triton.jit(do_not_specialize=["M", "stride_x", "stride_o", "split"])
def tc(
    x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_x, stride_o, split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
    ACT: tl.constexpr, DOT: tl.constexpr = tl.bfloat16,
):  # fmt: skip
    """Weights as the dot's first operand ([BLOCK_N channels, BLOCK_K] widened in registers),
    the step's rows as the second ([BLOCK_K, BLOCK_M]): out^T tiles [BLOCK_N, BLOCK_M]."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    k_len = K // split
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = pid_k * k_len + tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    xo = rm[None, :].to(tl.int64) * stride_x + rk[:, None]
    wp = w_ptr + rn[:, None].to(tl.int64) * K + rk[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, k_len, BLOCK_K):
        x = _act(x_ptr, xo + k0, m_ok[None, :], K, ACT)
        w = tl.load(wp + k0, mask=n_ok[:, None], other=0.0)
        acc = tl.dot(w.to(DOT), x.to(DOT), acc)
    s = tl.load(s_ptr + rn, mask=n_ok, other=0.0)
    out = acc * s[:, None]
    op = out_ptr + pid_k * M * N + rm[None, :].to(tl.int64) * stride_o + rn[:, None]
    tl.store(op, out.to(out_ptr.dtype.element_ty), mask=n_ok[:, None] & m_ok[None, :])


@triton.jit(do_not_specialize=["total", "split"])
def add_slices(part_ptr, out_ptr, total, split, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < total
    acc = tl.load(part_ptr + i, mask=ok, other=0.0)
    for j in range(1, split):
        acc += tl.load(part_ptr + j * total + i, mask=ok, other=0.0)
    tl.store(out_ptr + i, acc.to(out_ptr.dtype.element_ty), mask=ok)


def split_for(n: int, k: int, block_n: int, block_k: int, target: int) -> int:
    """Fewest K slices (each a whole number of block_k) giving >= target programs; <= 16."""
    strips = -(-n // block_n)
    blocks = k // block_k
    split = 1
    for d in range(1, min(16, blocks) + 1):
        if blocks % d == 0:
            split = d
            if strips * d >= target:
                break
    return split


def run_gemv(x, w, s, cfg, act=False):
    k = w.shape[1]
    n = w.shape[0]
    out = torch.empty((1, n), dtype=torch.bfloat16, device=x.device)
    gemv[(triton.cdiv(n, cfg["bn"]),)](
        x, w, s, out, n, k, x.stride(0),
        BLOCK_N=cfg["bn"], BLOCK_K=cfg["bk"], ACC2D=cfg["acc2d"], STAGES=cfg["stages"], ACT=act,
        num_warps=cfg["warps"], num_stages=cfg["stages"],
    )  # fmt: skip
    return out


def run_tc(x, w, s, cfg, sms, act=False, dot=tl.bfloat16):
    m = x.shape[0]
    n, k = w.shape
    bm = cfg["bm"]
    split = split_for(n, k, cfg["bn"], cfg["bk"], cfg["pps"] * sms) if cfg["pps"] else 1
    out = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    part = out if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    tc[(triton.cdiv(n, cfg["bn"]), split, triton.cdiv(m, bm))](
        x, w, s, part, m, n, k, x.stride(0), n, split,
        BLOCK_M=bm, BLOCK_N=cfg["bn"], BLOCK_K=cfg["bk"], STAGES=cfg["stages"], ACT=act, DOT=dot,
        num_warps=cfg["warps"], num_stages=cfg["stages"],
    )  # fmt: skip
    if split > 1:
        add_slices[(triton.cdiv(m * n, 1024),)](part, out, m * n, split, BLOCK=1024)
    return out


@triton.jit(do_not_specialize=["M", "stride_x", "stride_o", "split"])
def w8a8(
    xq_ptr, xs_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_x, stride_o, split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """FP8 x FP8 on the tensor cores, per-token x per-channel scales after the sum."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    k_len = K // split
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = pid_k * k_len + tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    xp = xq_ptr + rm[:, None].to(tl.int64) * stride_x + rk[None, :]
    wp = w_ptr + rn[None, :].to(tl.int64) * K + rk[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k_len, BLOCK_K):
        a = tl.load(xp + k0, mask=m_ok[:, None], other=0.0)
        b = tl.load(wp + k0, mask=n_ok[None, :], other=0.0)
        acc = tl.dot(a.to(DOT), b.to(DOT), acc)
    xs = tl.load(xs_ptr + rm, mask=m_ok, other=0.0)
    ws = tl.load(s_ptr + rn, mask=n_ok, other=0.0)
    out = acc * xs[:, None] * ws[None, :]
    op = out_ptr + pid_k * M * N + rm[:, None].to(tl.int64) * stride_o + rn[None, :]
    tl.store(op, out.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def run_w8a8(xq, xs, w, s, cfg, sms, dot=None):
    m = xq.shape[0]
    n, k = w.shape
    bm = cfg["bm"]
    split = split_for(n, k, cfg["bn"], cfg["bk"], cfg["pps"] * sms) if cfg["pps"] else 1
    out = torch.empty((m, n), dtype=torch.bfloat16, device=xq.device)
    part = out if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=xq.device)
    w8a8[(triton.cdiv(n, cfg["bn"]), split, triton.cdiv(m, bm))](
        xq, xs, w, s, part, m, n, k, xq.stride(0), n, split,
        BLOCK_M=bm, BLOCK_N=cfg["bn"], BLOCK_K=cfg["bk"], DOT=dot if dot is not None else tl.float8e4nv,
        num_warps=cfg["warps"], num_stages=cfg["stages"],
    )  # fmt: skip
    if split > 1:
        add_slices[(triton.cdiv(m * n, 1024),)](part, out, m * n, split, BLOCK=1024)
    return out


@triton.jit(do_not_specialize=["stride_x"])
def gemv_f16(
    x_ptr, xs_ptr, w_ptr, s_ptr, out_ptr, N, K, stride_x,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRE: tl.constexpr,
):  # fmt: skip
    """One row in fp16 arithmetic (session 28): Hopper converts e4m3 pairs to fp16 pairs in
    one instruction, where `gemv`'s widening to fp32 takes one more conversion an element
    (conversions run at 16 a clock an SM: at the weights' read rate that is the bound). The
    row is scaled into [-1, 1] first (its absolute max: found here, or given with PRE, as
    a norm kernel could hand it over), so fp16 products of e4m3 values (<= 448) cannot
    overflow; each [BLOCK_N, BLOCK_K] slot sums its K / BLOCK_K products in fp16 (<= 6,272
    for K = 14,336), then the slots in fp32."""
    pid_n = tl.program_id(0)
    row = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    xp = x_ptr + row * stride_x + rk
    if PRE:
        xa = tl.load(xs_ptr + row)
    else:
        amax = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            amax = tl.maximum(amax, tl.abs(tl.load(xp + k0).to(tl.float32)))
        xa = tl.maximum(tl.max(amax, axis=0), 1e-30)
    inv = 1.0 / xa
    wp = w_ptr + rn[:, None].to(tl.int64) * K + rk[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float16)
    for k0 in range(0, K, BLOCK_K):
        if PRE:  # noqa: SIM108 (a constexpr branch: one side is compiled)
            x16 = tl.load(xp + k0)
        else:
            x16 = (tl.load(xp + k0).to(tl.float32) * inv).to(tl.float16)
        w16 = tl.load(wp + k0, mask=n_ok[:, None], other=0.0).to(tl.float16)
        acc += w16 * x16[None, :]
    s = tl.load(s_ptr + rn, mask=n_ok, other=0.0)
    out = tl.sum(acc.to(tl.float32), axis=1) * (s * xa)
    tl.store(out_ptr + row * N + rn, out.to(out_ptr.dtype.element_ty), mask=n_ok)


def prescale_f16(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x / amax(|x|) per row in fp16, amax [M] fp32): what `gemv_f16` takes with PRE."""
    xa = x.float().abs().amax(dim=1).clamp(min=1e-30)
    return (x.float() / xa[:, None]).to(torch.float16), xa


def run_gemv_f16(x, w, s, cfg, xs=None):  # type: ignore[no-untyped-def]
    """`gemv_f16` of x [M, K] (bf16; or fp16 prescaled with its amax `xs`, cfg["pre"])."""
    m, k = x.shape
    n = w.shape[0]
    out = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    gemv_f16[(triton.cdiv(n, cfg["bn"]), m)](
        x, x if xs is None else xs, w, s, out, n, k, x.stride(0),
        BLOCK_N=cfg["bn"], BLOCK_K=cfg["bk"], PRE=int(xs is not None), num_warps=cfg["warps"],
    )  # fmt: skip
    return out


def tensorwise(xq, xs, w, s, one):
    """cuBLAS FP8 with unit scales, then the scales: the candidate that became
    model/fp8_matmul.py `w8a8_matmul` (now that function)."""
    from blitzscale.model import fp8_matmul

    return fp8_matmul.w8a8_matmul(xq, xs, w, s, one)


# --- what both sweeps set up: Llama-3-8B's linears, eight copies each, and their timing ----

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
COPIES = 8  # of each linear: 8 x 16.8 MB for the smallest in FP8, past the H200's 50 MB L2


def sweep_weights() -> tuple[dict, dict]:
    """(FP8 weights with scales, bf16 weights): COPIES of each shape, N(0, 0.02)."""
    from blitzscale.model.linear import quantize_rows

    torch.manual_seed(0)
    w8 = {
        s: [quantize_rows(torch.randn(n, k, device="cuda") * 0.02) for _ in range(COPIES)]
        for s, (n, k) in SHAPES.items()
    }
    w16 = {
        s: [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(COPIES)]
        for s, (n, k) in SHAPES.items()
    }
    return w8, w16


def sweep_inputs(ms: tuple[int, ...]) -> dict:
    """Random bf16 activations per step size and linear: {m: {shape: [m, K]}}."""
    return {
        m: {s: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for s, (n, k) in SHAPES.items()}
        for m in ms
    }


class SweepLog:
    """A sweep's JSON result (`res`: device, SM count, rows) and its progress lines (`log`),
    each line stamped with the seconds since the sweep began."""

    def __init__(self) -> None:
        import time

        self.t0 = time.time()
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count
        self.res: dict = {"device": torch.cuda.get_device_name(), "sms": self.sms, "rows": []}

    def log(self, **kw) -> None:  # type: ignore[no-untyped-def]
        import json
        import time

        kw["t"] = round(time.time() - self.t0, 1)
        print(json.dumps(kw), flush=True)


class OneRowSweep(SweepLog):
    """What the one-row sweeps share (fp8_gemv_f16_h200.py, fp8_gemv_bits.py): the weights
    (`w8`, `w16`), one bf16 row per linear (`x`) and its per-token quantization (`xq`),
    cuBLAS's unit scale (`one`), bf16 `F.linear` timed first as the reference (`bf16`), and
    `record` for each row of the result."""

    def __init__(self) -> None:
        import torch.nn.functional as F

        from blitzscale.model.triton_ops import quantize_tokens

        super().__init__()
        self.w8, self.w16 = sweep_weights()
        self.x = sweep_inputs((1,))[1]
        self.xq = {s: quantize_tokens(self.x[s]) for s in SHAPES}
        self.one = torch.ones((), device="cuda")
        self.bf16 = layer_ms(lambda s, i: F.linear(self.x[s], self.w16[s][i]))
        self.res["bf16"] = self.bf16
        self.log(bf16=self.bf16)

    def record(self, kind: str, cfg: dict, t: dict) -> None:
        row = {"kind": kind, "cfg": cfg, "ms": t, "over_bf16": round(t["layer"] / self.bf16["layer"], 3)}
        self.res["rows"].append(row)
        self.log(**row)


def per_call(fn_of_copy) -> float:  # type: ignore[no-untyped-def]
    """ms of one call, every copy in turn, replayed from a CUDA graph (no L2 reuse)."""
    from blitzscale.bench.limits import graph_replay_ms

    return graph_replay_ms(lambda: [fn_of_copy(i) for i in range(COPIES)], reps=2) / COPIES


def layer_ms(fn) -> dict:  # type: ignore[no-untyped-def]
    """ms of one call of fn(shape, copy) for each linear of SHAPES (`per_call`: every copy in
    turn, from a CUDA graph), and their sum as "layer"."""
    out = {s: round(per_call(lambda i, s=s: fn(s, i)), 4) for s in SHAPES}
    out["layer"] = round(sum(out[s] for s in SHAPES), 4)
    return out
