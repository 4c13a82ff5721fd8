"""Engine logprobs (`TokenLogprob`) -> OpenAI's two shapes: completions' parallel lists and
chat's per-token objects. A token's text is the tokenizer's decoding of that token alone
(a piece of a multi-byte character decodes to U+FFFD, as in vLLM); `bytes` are its UTF-8."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from blitzscale.api.responses import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob
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


def prompt_logprobs(
    decode: Decode, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob]
) -> CompletionLogprobs:
    """An echoed prompt's entries (`echo` with `logprobs`): its first token has no logprob
    (null, as OpenAI's and vLLM's), each later one its `logprobs[i - 1]`."""
    if not token_ids:
        return CompletionLogprobs()
    out = completion_logprobs(decode, token_ids, [TokenLogprob(0.0), *logprobs], 0)
    out.token_logprobs[0] = out.top_logprobs[0] = None
    return out


def joined(a: CompletionLogprobs, b: CompletionLogprobs) -> CompletionLogprobs:
    """`a`'s entries, then `b`'s."""
    return CompletionLogprobs(
        tokens=a.tokens + b.tokens,
        token_logprobs=a.token_logprobs + b.token_logprobs,
        top_logprobs=a.top_logprobs + b.top_logprobs,
        text_offset=a.text_offset + b.text_offset,
    )


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
