"""Engine logprobs (`TokenLogprob`) -> OpenAI's two shapes: completions' parallel lists and
chat's per-token objects. A token's text is the tokenizer's decoding of that token alone
(a piece of a multi-byte character decodes to U+FFFD, as in vLLM); `bytes` are its UTF-8."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from blitzscale.api.protocol import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob
from blitzscale.core.outputs import TokenLogprob

Decode = Callable[[list[int]], str]


def _texts(decode: Decode, ids: Sequence[int]) -> dict[int, str]:
    return {t: decode([t]) for t in set(ids)}


def completion_logprobs(
    decode: Decode, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob], offset: int
) -> CompletionLogprobs:
    """`offset`: characters of the choice's text before these tokens (for `text_offset`)."""
    ids = [*token_ids, *(t for lp in logprobs for t, _ in lp.top)]
    text = _texts(decode, ids)
    out = CompletionLogprobs()
    for tok, lp in zip(token_ids, logprobs, strict=True):
        out.tokens.append(text[tok])
        out.token_logprobs.append(lp.logprob)
        out.top_logprobs.append({text[t]: v for t, v in lp.top})
        out.text_offset.append(offset)
        offset += len(text[tok])
    return out


def chat_logprobs(decode: Decode, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob]) -> ChatLogprobs:
    text = _texts(decode, [*token_ids, *(t for lp in logprobs for t, _ in lp.top)])

    def top(t: int, v: float) -> TopLogprob:
        return TopLogprob(token=text[t], logprob=v, bytes=list(text[t].encode()))

    content = [
        ChatTokenLogprob(
            token=text[tok],
            logprob=lp.logprob,
            bytes=list(text[tok].encode()),
            top_logprobs=[top(t, v) for t, v in lp.top],
        )
        for tok, lp in zip(token_ids, logprobs, strict=True)
    ]
    return ChatLogprobs(content=content)
