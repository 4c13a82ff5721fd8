"""Prompt logprobs (`SamplingParams.prompt_logprobs`, vLLM's): the log-probability of each
prompt token after the first given the tokens before it, and the most likely tokens there,
from the logits of every prompt position (where a step otherwise computes the logits of a
prompt's last position alone).

Every path that computes prompt positions calls `record` with the step's hidden states
(after the last layer) and where each asking request's positions lie in them: the
scheduler's steps (engine/model_runner.py, eagerly: a captured graph gives the last rows'
logits only), a live target's head stage and a relayed prompt's finish (engine/live.py).
A request records each position once, in order (`Request.add_prompt_logprobs`); its output
with the first token carries them (engine/output.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from blitzscale.engine.logits import token_logprobs
from blitzscale.engine.request import Request

# Logits rows computed at once: a [rows, vocab] fp32 block (128 MB at Llama-3's 128,256
# tokens), whatever the prompt's length.
ROWS_AT_ONCE = 256


@dataclass(frozen=True)
class PromptSpan:
    """A request's positions [start, start + count) at rows [row, row + count) of a step."""

    request: Request
    row: int
    start: int
    count: int


def record(
    logits_of: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, spans: Sequence[PromptSpan]
) -> None:
    """Record, for each span's request, the prompt logprobs its positions give
    (`logits_of`: final hidden rows -> logits, the model's head)."""
    for sp in spans:
        req = sp.request
        positions = req.prompt_logprob_positions(sp.start, sp.count)
        if not positions:
            continue
        k = req.params.prompt_logprobs or 0
        first = sp.row + positions.start - sp.start
        found = []
        for a in range(0, len(positions), ROWS_AT_ONCE):
            n = min(ROWS_AT_ONCE, len(positions) - a)
            p = positions.start + a
            targets = req.prompt_token_ids[p + 1 : p + 1 + n]
            found += token_logprobs(logits_of(hidden[first + a : first + a + n]), targets, [k] * n)
        req.add_prompt_logprobs(positions.start, found)


def whole_prompt_spans(reqs: Sequence[Request]) -> list[PromptSpan]:
    """Spans of requests whose whole prompts lie one after another in a step's rows (a live
    target's batch, relayed prompts), for those that ask for prompt logprobs."""
    spans, row = [], 0
    for r in reqs:
        if r.needs_prompt_logits:
            spans.append(PromptSpan(r, row, 0, r.num_tokens))
        row += r.num_tokens
    return spans
