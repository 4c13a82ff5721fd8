"""Batched sampling: logits processors (engine/logits.py), then greedy, temperature, min-p,
top-k, top-p (vLLM's order), per-request seeds; structured output's token masks
(blitzscale/structured.py) after the processors, on the logits' device.

On CUDA the whole batch is sampled on the GPU and read back in one copy (the step's only
wait for the device): parameters go up by an asynchronous copy, unseeded rows draw by the
exponential race (argmax of p / Exp(1), exact sampling from p) on the GPU's generator. A
seeded row draws from its own CPU torch.Generator exactly as on CPU, so its stream stays
reproducible and can migrate between instances (that row's probabilities come to the host).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from blitzscale.core.sampling import SamplingParams
from blitzscale.engine.logits import History, process
from blitzscale.engine.sync import wait_for_device

NO_TOKEN = -1  # a row with no valid distribution (non-finite logits): its request fails


@dataclass(frozen=True)
class TokenMask:
    """The tokens structured output allows: `bitmask` (host, int32, one row per logits row,
    one bit per token, filled by the rows' grammar matchers) applies to `rows` only."""

    bitmask: torch.Tensor
    rows: list[int]


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    history: History | None = None,
    mask: TokenMask | None = None,
) -> list[int]:
    """One token per row of `logits` ([N, vocab], float32); NO_TOKEN for a row whose logits
    are not all finite (or that a mask leaves nothing), so that one request fails and the
    rest of the batch goes on. `history` (the rows' tokens) is needed by rows with logits
    processors; `logits` itself is left as it is."""
    if logits.device.type == "cuda":
        return _sample_on_device(logits, params, generators, history, mask)
    wait_for_device(logits.device)  # before any .tolist(): wait without the GIL
    logits, bad = _prepared(logits, params, history, mask)
    out = _sample(logits, params, generators)
    return [NO_TOKEN if b else t for t, b in zip(out, bad.tolist(), strict=True)]


def _prepared(
    logits: torch.Tensor, params: list[SamplingParams], history: History | None, mask: TokenMask | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits after the processors and the mask, and which rows have no valid
    distribution (a non-finite raw logit; or, after the processors and the mask, a NaN, a
    +inf or nothing left but -inf). Bad rows hold zeros: they are sampled harmlessly, then
    discarded."""
    bad = ~torch.isfinite(logits).all(dim=-1)
    if mask is None and all(p.is_greedy and not p.processes_logits for p in params):
        return logits, bad  # argmax needs no valid distribution (bad rows are dropped)
    logits = logits.masked_fill(bad[:, None], 0.0)  # (a new tensor: the raw logits stay)
    processed = any(p.processes_logits for p in params)
    if processed:
        logits = process(logits, params, history)
    if mask is not None:
        from blitzscale.structured import apply_bitmask

        apply_bitmask(logits, mask.bitmask, mask.rows)
    if processed or mask is not None:
        bad |= logits.isnan().any(dim=-1) | logits.isposinf().any(dim=-1) | logits.isneginf().all(dim=-1)
        logits = logits.masked_fill(bad[:, None], 0.0)
    return logits, bad


def _filtered(
    logits: torch.Tensor, params: list[SamplingParams], rows: list[int], idx: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities after temperature, min-p, top-k and top-p, sorted descending, and
    their ids. Min-p cuts a token whose probability is below min_p times the first's: whose
    logit is below the first's plus log(min_p) (-inf for 0: nothing cut)."""
    vocab = logits.shape[-1]
    host = torch.tensor(
        [
            [params[i].temperature for i in rows],
            [params[i].top_k if params[i].top_k > 0 else vocab for i in rows],
            [params[i].top_p for i in rows],
            [params[i].min_p for i in rows],
        ],
        dtype=torch.float32,
    )
    if logits.device.type == "cuda":
        host = host.pin_memory()
    temps, top_k, top_p, min_p = host.to(logits.device, non_blocking=True)
    sorted_logits, sorted_ids = (logits[idx] / temps[:, None]).sort(dim=-1, descending=True)
    floor = sorted_logits[:, :1] + min_p.log()[:, None]
    sorted_logits = sorted_logits.masked_fill(sorted_logits < floor, float("-inf"))
    rank = torch.arange(vocab, device=logits.device)[None, :]
    sorted_logits = sorted_logits.masked_fill(rank >= top_k[:, None], float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    sorted_logits = sorted_logits.masked_fill(mass_before >= top_p[:, None], float("-inf"))
    return sorted_logits.softmax(dim=-1), sorted_ids


def _sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[int]:
    out = logits.argmax(dim=-1)
    rows = [i for i, p in enumerate(params) if not p.is_greedy]
    if not rows:
        return out.tolist()
    idx = torch.tensor(rows, device=logits.device)
    probs, sorted_ids = _filtered(logits, params, rows, idx)
    picks = torch.multinomial(probs, 1).squeeze(1)
    for j, i in enumerate(rows):  # seeded requests draw from their own CPU generator
        if generators[i] is not None:
            picks[j] = torch.multinomial(probs[j].cpu(), 1, generator=generators[i]).item()
    out[idx] = sorted_ids.gather(1, picks[:, None]).squeeze(1)
    return out.tolist()


def sample_async(
    logits: torch.Tensor, params: list[SamplingParams]
) -> tuple[torch.Tensor, torch.Tensor, torch.cuda.Event | None]:
    """`sample` for rows that draw from no generator of their own and read no history of
    their own (`SamplingParams.reads_every_step` is false), without waiting: the
    ids stay on the device (the next step's input; a row without a valid distribution
    holds 0 there), a copy is on its way to pinned host memory (NO_TOKEN for such a row),
    and the event is recorded after that copy (None on CPU, where nothing is in flight)."""
    none: list[torch.Generator | None] = [None] * len(params)
    if any(p.reads_every_step for p in params):
        raise ValueError("a row that reads its own history every step cannot be sampled a step late")
    if logits.device.type != "cuda":
        host = torch.tensor(sample(logits, params, none), dtype=torch.long)
        return host.clamp_min(0), host, None
    out = _draw_on_device(logits, params, none)
    host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
    host.copy_(out, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return out.clamp_min(0), host, ready


def _sample_on_device(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    history: History | None,
    mask: TokenMask | None = None,
) -> list[int]:
    out = _draw_on_device(logits, params, generators, history, mask)
    host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
    host.copy_(out, non_blocking=True)
    wait_for_device(logits.device)  # the one wait of the step, without the GIL
    return host.tolist()


def _draw_on_device(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    history: History | None = None,
    mask: TokenMask | None = None,
) -> torch.Tensor:
    """The batch's ids on the device, NO_TOKEN for a row with non-finite logits."""
    logits, bad = _prepared(logits, params, history, mask)
    out = logits.argmax(dim=-1)
    rows = [i for i, p in enumerate(params) if not p.is_greedy]
    if rows:
        idx = torch.tensor(rows).pin_memory().to(logits.device, non_blocking=True)
        probs, sorted_ids = _filtered(logits, params, rows, idx)
        race = probs / torch.empty_like(probs).exponential_().clamp_min_(1e-30)
        picks = race.argmax(dim=-1)
        seeded = [j for j, i in enumerate(rows) if generators[i] is not None]
        if seeded:
            wait_for_device(logits.device)
            host = probs[seeded].cpu()
            drawn = [
                torch.multinomial(host[k], 1, generator=generators[rows[j]]).item()
                for k, j in enumerate(seeded)
            ]
            picks[seeded] = torch.tensor(drawn).to(logits.device, non_blocking=True)
        out[idx] = sorted_ids.gather(1, picks[:, None]).squeeze(1)
    return torch.where(bad, NO_TOKEN, out)
