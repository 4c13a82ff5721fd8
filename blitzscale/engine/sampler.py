"""Batched sampling: greedy, temperature, top-k, top-p, per-request seeds."""

from __future__ import annotations

import torch

from blitzscale.engine.request import SamplingParams
from blitzscale.engine.sync import wait_for_device

NO_TOKEN = -1  # a row with no valid distribution (non-finite logits): its request fails


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[int]:
    """One token per row of `logits` ([N, vocab], float32); NO_TOKEN for a row whose logits
    are not all finite, so that one request fails and the rest of the batch goes on."""
    wait_for_device(logits.device)  # before any .tolist(): wait without the GIL
    bad = ~torch.isfinite(logits).all(dim=-1)
    logits = logits.masked_fill(bad[:, None], 0.0)  # sampled harmlessly, then discarded
    out = _sample(logits, params, generators)
    return [NO_TOKEN if b else t for t, b in zip(out, bad.tolist(), strict=True)]


def _sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[int]:
    out = logits.argmax(dim=-1)
    rows = [i for i, p in enumerate(params) if not p.is_greedy]
    if not rows:
        return out.tolist()
    idx = torch.tensor(rows, device=logits.device)
    temps = torch.tensor([params[i].temperature for i in rows], device=logits.device)
    sorted_logits, sorted_ids = (logits[idx] / temps[:, None]).sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    top_k = torch.tensor(
        [params[i].top_k if params[i].top_k > 0 else vocab for i in rows], device=logits.device
    )
    rank = torch.arange(vocab, device=logits.device)[None, :]
    sorted_logits = sorted_logits.masked_fill(rank >= top_k[:, None], float("-inf"))
    top_p = torch.tensor([params[i].top_p for i in rows], device=logits.device)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    sorted_logits = sorted_logits.masked_fill(mass_before >= top_p[:, None], float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    picks = torch.multinomial(probs, 1).squeeze(1)
    for j, i in enumerate(rows):  # seeded requests draw from their own CPU generator
        if generators[i] is not None:
            picks[j] = torch.multinomial(probs[j].cpu(), 1, generator=generators[i]).item()
    out[idx] = sorted_ids.gather(1, picks[:, None]).squeeze(1)
    return out.tolist()
