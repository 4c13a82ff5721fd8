"""RequestOutputs -> OpenAI response bodies and stream chunks, for completions and chat.

A `*Format` knows one request's id, creation time, model name and whether logprobs were
asked for, and builds each body from outputs: one per choice (`n` > 1 runs one backend
request per choice, see openai_routes.py); `openai_events` is the stream both endpoints send.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel

from blitzscale.api.errors import stream_error
from blitzscale.api.generation import Generation
from blitzscale.api.logprobs import Decode, chat_logprobs, completion_logprobs, joined, prompt_logprobs
from blitzscale.api.reasoning import ReasoningSplit
from blitzscale.api.responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    Usage,
)
from blitzscale.api.sse import DONE_EVENT, sse_event
from blitzscale.api.tools import ChoiceCalls, ToolPlan
from blitzscale.core.outputs import RequestOutput


def usage_of(outs: Sequence[RequestOutput], per_prompt: int | None = None) -> Usage:
    """Each prompt counts once (`per_prompt` choices each, in order: all of them by
    default); every choice's tokens count."""
    prompts = outs[:: per_prompt or max(1, len(outs))]
    return Usage.of(sum(o.num_prompt_tokens for o in prompts), sum(len(o.token_ids) for o in outs))


class OpenAIFormat(Protocol):
    @property
    def request_id(self) -> str: ...

    def opening(self, n: int) -> list[BaseModel]: ...

    def chunk(self, index: int, out: RequestOutput) -> BaseModel | None: ...

    def usage_chunk(self, finals: Sequence[RequestOutput]) -> BaseModel: ...

    def running_usage(self, out: RequestOutput) -> Usage: ...

    def response(self, finals: Sequence[RequestOutput]) -> BaseModel: ...


def _wants_chunk(out: RequestOutput) -> bool:
    """A chunk for every step that made tokens, also when their text is held back (a stop
    string may be starting, a character is incomplete, the model has no tokenizer), so a
    client sees each token when it is made; vLLM streams the same way."""
    return bool(out.new_token_ids or out.text_delta or out.finished or out.logprobs)


@dataclass(frozen=True)
class Echo:
    """`echo` for one prompt: its choices' texts start with the prompt's, and with
    `logprobs` their entries with the prompt tokens' (engine prompt logprobs; the first
    token's is null)."""

    text: str
    token_ids: list[int]


@dataclass
class CompletionFormat:
    request_id: str
    created: int
    model: str
    decode: Decode | None = None  # set when logprobs were asked for
    n: int = 1  # choices per prompt (choice i is of prompt i // n)
    echoes: Sequence[Echo] = ()  # with `echo`: one per prompt
    prompt_only: bool = False  # `max_tokens` 0 with `echo`: the prompt alone, nothing generated
    # characters of each choice's tokens streamed so far (`text_offset` counts the tokens'
    # texts, as a whole response does: a chunk's text may lag its tokens behind a stop string)
    _offsets: dict[int, int] = field(default_factory=dict)
    _echoed: set[int] = field(default_factory=set)  # choices whose stream carried the prompt

    def opening(self, n: int) -> list[BaseModel]:
        return []

    def chunk(self, index: int, out: RequestOutput) -> BaseModel | None:
        out = self._shown(out)
        echo = self._echo(index) if index not in self._echoed else None  # (in the first chunk)
        if echo is None and not _wants_chunk(out):
            return None
        self._echoed.add(index)
        offset = self._offsets.get(index, 0)
        lps = self._logprobs(echo, out, out.new_token_ids, offset)
        if isinstance(lps, CompletionLogprobs):
            self._offsets[index] = offset + sum(len(t) for t in lps.tokens)
        reason = out.finish_reason if out.finished else None
        text = (echo.text if echo is not None else "") + out.text_delta
        return self._body([CompletionChoice(index=index, text=text, logprobs=lps, finish_reason=reason)])

    def usage_chunk(self, finals: Sequence[RequestOutput]) -> BaseModel:
        return self._body([], usage_of([self._shown(f) for f in finals], self.n))

    def running_usage(self, out: RequestOutput) -> Usage:
        return usage_of([self._shown(out)])

    def response(self, finals: Sequence[RequestOutput]) -> BaseModel:
        shown = [self._shown(f) for f in finals]
        choices = []
        for i, f in enumerate(shown):
            echo = self._echo(i)
            text = (echo.text if echo is not None else "") + f.text
            lps = self._logprobs(echo, f, f.token_ids, 0)
            choices.append(CompletionChoice(index=i, text=text, logprobs=lps, finish_reason=f.finish_reason))
        return self._body(choices, usage_of(shown, self.n))

    def _echo(self, index: int) -> Echo | None:
        return self.echoes[index // self.n] if self.echoes else None

    def _shown(self, out: RequestOutput) -> RequestOutput:
        """The output as the client sees it: with `prompt_only`, nothing generated (the
        engine ran one token for the prompt's logprobs) and "length" as its end."""
        if not self.prompt_only:
            return out
        reason = "length" if out.finished and out.finish_reason != "error" else out.finish_reason
        return dataclasses.replace(
            out, new_token_ids=[], token_ids=[], text_delta="", text="", logprobs=(), finish_reason=reason
        )

    def _logprobs(
        self, echo: Echo | None, out: RequestOutput, ids: Sequence[int], offset: int
    ) -> BaseModel | None:
        """`ids`' entries (the output's logprobs), after the prompt's when `echo` is given."""
        if self.decode is None:
            return None
        if echo is None:
            return completion_logprobs(self.decode, ids, out.logprobs, offset)
        head = prompt_logprobs(self.decode, echo.token_ids, out.prompt_logprobs)
        offset += sum(len(t) for t in head.tokens)
        return joined(head, completion_logprobs(self.decode, ids, out.logprobs, offset))

    def _body(self, choices: list[CompletionChoice], usage: Usage | None = None) -> CompletionResponse:
        return CompletionResponse(
            id=self.request_id, created=self.created, model=self.model, choices=choices, usage=usage
        )


@dataclass
class ChatFormat:
    request_id: str
    created: int
    model: str
    decode: Decode | None = None  # set when logprobs were asked for
    tools: ToolPlan | None = None  # the request's tools: calls are read out of the text
    # a thinking model's reply (api/reasoning.py): None, no thinking apart; else whether the
    # prompt left the reply inside its thinking
    thinking: bool | None = None
    _calls: dict[int, ChoiceCalls] = field(default_factory=dict)  # each streamed choice's
    _splits: dict[int, ReasoningSplit] = field(default_factory=dict)

    def opening(self, n: int) -> list[BaseModel]:
        """OpenAI's first chunk of each choice names the role and carries no text."""
        delta = {"role": "assistant", "content": ""}
        return [self._chunk([ChatChunkChoice(index=i, delta=delta)]) for i in range(n)]

    def chunk(self, index: int, out: RequestOutput) -> BaseModel | None:
        if not _wants_chunk(out):
            return None
        reason = out.finish_reason if out.finished else None
        reasoning, text = "", out.text_delta
        if self.thinking is not None:
            split = self._splits.setdefault(index, ReasoningSplit(self.thinking))
            reasoning, text = split.feed(out.text_delta, out.finished)
        delta: dict[str, Any] = {"reasoning_content": reasoning} if reasoning else {}
        if self.tools is not None:
            calls = self._calls.setdefault(index, ChoiceCalls(self.tools))
            text, deltas = calls.step(text, out.finished)
            if deltas:
                delta["tool_calls"] = deltas
            reason = calls.finish_reason(reason)
        if text:
            delta["content"] = text
        lps = chat_logprobs(self.decode, out.new_token_ids, out.logprobs) if self.decode else None
        return self._chunk([ChatChunkChoice(index=index, delta=delta, logprobs=lps, finish_reason=reason)])

    def usage_chunk(self, finals: Sequence[RequestOutput]) -> BaseModel:
        return self._chunk([], usage_of(finals))

    def running_usage(self, out: RequestOutput) -> Usage:
        return usage_of([out])

    def response(self, finals: Sequence[RequestOutput]) -> BaseModel:
        choices = []
        for i, f in enumerate(finals):
            reasoning, content, reason = None, f.text, f.finish_reason
            if self.thinking is not None:
                reasoning, content = ReasoningSplit(self.thinking).feed(f.text, finished=True)
            message = AssistantMessage(content=content, reasoning_content=reasoning)
            if self.tools is not None:
                calls = ChoiceCalls(self.tools)
                text, tool_calls = calls.whole(content)
                message = AssistantMessage(content=text, tool_calls=tool_calls, reasoning_content=reasoning)
                reason = calls.finish_reason(reason)
            lps = chat_logprobs(self.decode, f.token_ids, f.logprobs) if self.decode else None
            choices.append(ChatChoice(index=i, message=message, logprobs=lps, finish_reason=reason))
        return ChatCompletionResponse(
            id=self.request_id,
            created=self.created,
            model=self.model,
            choices=choices,
            usage=usage_of(finals),
        )

    def _chunk(self, choices: list[ChatChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.request_id, created=self.created, model=self.model, choices=choices, usage=usage
        )


async def _merged(
    gens: Sequence[Generation], firsts: Sequence[RequestOutput]
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Every choice's outputs as they come, tagged with the choice's index; raises the
    first failure of any choice."""
    if len(gens) == 1:  # the usual case: no tasks
        out = firsts[0]
        yield 0, out
        while not out.finished:
            out = await gens[0].next()
            yield 0, out
        return
    queue: asyncio.Queue[tuple[int, RequestOutput | Exception]] = asyncio.Queue()

    async def pump(i: int) -> None:
        out = firsts[i]
        queue.put_nowait((i, out))
        try:
            while not out.finished:
                out = await gens[i].next()
                queue.put_nowait((i, out))
        except Exception as e:
            queue.put_nowait((i, e))

    tasks = [asyncio.create_task(pump(i)) for i in range(len(gens))]
    try:
        left = len(gens)
        while left:
            i, item = await queue.get()
            if isinstance(item, Exception):
                raise item
            left -= item.finished
            yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def openai_events(
    gens: Sequence[Generation],
    firsts: Sequence[RequestOutput],
    fmt: OpenAIFormat,
    include_usage: bool,
    continuous_usage: bool = False,
) -> AsyncIterator[str]:
    """One chunk per output that has text, logprobs or finishes (tagged with its choice),
    the usage chunk if asked, `[DONE]`. `continuous_usage` (vLLM's `continuous_usage_stats`):
    every chunk also carries its choice's usage so far (its prompt, its tokens).

    An error after the stream started cannot change the status any more: it is sent as an
    `{"error": ...}` event (what OpenAI's client raises on), followed by `[DONE]`.
    """
    for i, opening in enumerate(fmt.opening(len(gens))):
        if continuous_usage:
            opening.usage = Usage.of(firsts[i].num_prompt_tokens, 0)  # type: ignore[attr-defined]
        yield sse_event(opening)
    finals: dict[int, RequestOutput] = {}
    try:
        async for i, out in _merged(gens, firsts):
            chunk = fmt.chunk(i, out)
            if chunk is not None:
                if continuous_usage:
                    chunk.usage = fmt.running_usage(out)  # type: ignore[attr-defined]
                yield sse_event(chunk)
            if out.finished:
                finals[i] = out
    except Exception as e:
        yield sse_event(stream_error(e, gens[0].request_id))
        yield DONE_EVENT
        return
    if include_usage:
        yield sse_event(fmt.usage_chunk([finals[i] for i in sorted(finals)]))
    yield DONE_EVENT
