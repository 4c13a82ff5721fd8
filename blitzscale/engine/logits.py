"""Logits processors of vLLM-compatible servers, batched: min_tokens, logit_bias and the
repetition, frequency and presence penalties; and the logprobs the API reports.

They apply in vLLM's order, before temperature, top-k and top-p (engine/sampler.py):
1. min_tokens: while a request has fewer output tokens than `min_tokens`, its EOS ids
   (unless `ignore_eos`) and `stop_token_ids` get -inf;
2. logit_bias: each (token, bias) is added to that token's logit;
3. repetition_penalty (transformers' and vLLM's): a token seen in the prompt or the
   output has its logit divided by the penalty if positive, multiplied by it if not;
4. frequency and presence penalties (OpenAI's formula): logit -= frequency x (times the
   token is in the output) + presence x (1 if it is in the output at all).
Each runs on the logits' own device, on the rows that ask for it; the token history goes up
as one index tensor. Logprobs come from the raw logits (the model's distribution, before any
of the above), which is what vLLM returns by default (`logprobs_mode = "raw_logprobs"`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from blitzscale.core.outputs import TokenLogprob
from blitzscale.core.sampling import SamplingParams


class TokenHistory(Protocol):
    """What the processors read of a row's request (engine.request.Request has it)."""

    @property
    def token_ids(self) -> list[int]: ...  # prompt, then output

    @property
    def num_prompt_tokens(self) -> int: ...


@dataclass(frozen=True)
class History:
    """The batch's requests in row order, and the ids `min_tokens` holds back as EOS."""

    rows: Sequence[TokenHistory]
    eos_token_ids: frozenset[int] = frozenset()


def process(logits: torch.Tensor, params: Sequence[SamplingParams], history: History | None) -> torch.Tensor:
    """`logits` ([N, vocab]) after every processor its rows ask for; the same tensor when no
    row asks for any (otherwise a new one: the raw logits stay as they were, for logprobs)."""
    rows = [i for i, p in enumerate(params) if p.processes_logits]
    if not rows:
        return logits
    if history is None:
        raise ValueError("logits processors need the rows' token history")
    out = logits.clone()
    _min_tokens(out, params, history, rows)
    _logit_bias(out, params, rows)
    penalized = [i for i in rows if params[i].has_penalties]
    if penalized:
        _penalties(out, params, history, penalized)
    return out


def _upload(
    values: list[list[float]] | list[list[int]], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    host = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def _min_tokens(
    out: torch.Tensor, params: Sequence[SamplingParams], history: History, rows: list[int]
) -> None:
    vocab = out.shape[-1]
    pairs: list[list[int]] = []
    for i in rows:
        p, h = params[i], history.rows[i]
        if len(h.token_ids) - h.num_prompt_tokens >= p.min_tokens:
            continue
        held = set(p.stop_token_ids) | (set() if p.ignore_eos else set(history.eos_token_ids))
        pairs += [[i, t] for t in sorted(held) if 0 <= t < vocab]
    if pairs:
        idx = _upload(pairs, torch.long, out.device)
        out[idx[:, 0], idx[:, 1]] = float("-inf")


def _logit_bias(out: torch.Tensor, params: Sequence[SamplingParams], rows: list[int]) -> None:
    pairs = [[i, t] for i in rows for t, _ in params[i].logit_bias]
    if not pairs:
        return
    idx = _upload(pairs, torch.long, out.device)
    bias = _upload([[b for i in rows for _, b in params[i].logit_bias]], out.dtype, out.device)[0]
    out.index_put_((idx[:, 0], idx[:, 1]), bias, accumulate=True)


def _penalties(
    out: torch.Tensor, params: Sequence[SamplingParams], history: History, rows: list[int]
) -> None:
    n, vocab, dev = len(rows), out.shape[-1], out.device
    pairs = [
        [j, t, int(k >= history.rows[i].num_prompt_tokens)]
        for j, i in enumerate(rows)
        for k, t in enumerate(history.rows[i].token_ids)
        if 0 <= t < vocab
    ]
    counts = torch.zeros((n, vocab), dtype=out.dtype, device=dev)  # in the output
    seen = torch.zeros((n, vocab), dtype=torch.bool, device=dev)  # in the prompt or the output
    if pairs:
        idx = _upload(pairs, torch.long, dev)
        seen[idx[:, 0], idx[:, 1]] = True
        counts.index_put_((idx[:, 0], idx[:, 1]), idx[:, 2].to(out.dtype), accumulate=True)
    knobs = _upload(
        [
            [params[i].repetition_penalty, params[i].frequency_penalty, params[i].presence_penalty]
            for i in rows
        ],
        out.dtype,
        dev,
    )
    rep, freq, pres = knobs[:, 0:1], knobs[:, 1:2], knobs[:, 2:3]
    x = out[rows]
    x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
    x = x - freq * counts - pres * (counts > 0).to(out.dtype)
    out[rows] = x


def logprobs_of(
    logits: torch.Tensor, tokens: Sequence[int], params: Sequence[SamplingParams]
) -> list[TokenLogprob | None]:
    """For each row that asks (`logprobs` set): the sampled token's log-probability under
    the raw `logits` and the `logprobs` most likely tokens'; None for the other rows."""
    rows = [i for i, p in enumerate(params) if p.logprobs is not None and tokens[i] >= 0]
    out: list[TokenLogprob | None] = [None] * len(params)
    if not rows:
        return out
    found = token_logprobs(logits[rows], [tokens[i] for i in rows], [params[i].logprobs or 0 for i in rows])
    for i, lp in zip(rows, found, strict=True):
        out[i] = lp
    return out


def token_logprobs(logits: torch.Tensor, tokens: Sequence[int], ks: Sequence[int]) -> list[TokenLogprob]:
    """Row i's `tokens[i]` log-probability under the raw `logits` ([N, vocab]) and its
    `ks[i]` most likely tokens' (the log-softmax in fp32)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    k = max(ks, default=0)
    picked = lp.gather(1, torch.tensor(tokens, device=lp.device).view(-1, 1)).squeeze(1).tolist()
    top_v, top_i = lp.topk(k, dim=-1) if k else (lp[:, :0], lp[:, :0].long())
    top_v, top_i = top_v.tolist(), top_i.tolist()
    return [
        TokenLogprob(picked[j], tuple(zip(top_i[j][:kk], top_v[j][:kk], strict=True)))
        for j, kk in enumerate(ks)
    ]
