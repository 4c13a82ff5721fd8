"""RequestOutputs -> OpenAI response bodies and stream chunks, for completions and chat.

A `*Format` knows one request's id, creation time and model name, and builds each body
from outputs; `openai_events` is the stream both endpoints send.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel

from blitzscale.api.errors import stream_error
from blitzscale.api.generation import Generation
from blitzscale.api.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionResponse,
    Usage,
)
from blitzscale.api.sse import DONE_EVENT, sse_event
from blitzscale.engine.request import RequestOutput


def usage_of(out: RequestOutput) -> Usage:
    return Usage.of(out.num_prompt_tokens, len(out.token_ids))


class OpenAIFormat(Protocol):
    @property
    def request_id(self) -> str: ...

    def opening(self) -> list[BaseModel]: ...

    def chunk(self, text: str, finish_reason: str | None) -> BaseModel: ...

    def usage_chunk(self, usage: Usage) -> BaseModel: ...

    def response(self, final: RequestOutput) -> BaseModel: ...


@dataclass(frozen=True)
class CompletionFormat:
    request_id: str
    created: int
    model: str

    def opening(self) -> list[BaseModel]:
        return []

    def chunk(self, text: str, finish_reason: str | None) -> BaseModel:
        return self._body([CompletionChoice(text=text, finish_reason=finish_reason)], None)

    def usage_chunk(self, usage: Usage) -> BaseModel:
        return self._body([], usage)

    def response(self, final: RequestOutput) -> BaseModel:
        choice = CompletionChoice(text=final.text, finish_reason=final.finish_reason)
        return self._body([choice], usage_of(final))

    def _body(self, choices: list[CompletionChoice], usage: Usage | None) -> CompletionResponse:
        return CompletionResponse(
            id=self.request_id, created=self.created, model=self.model, choices=choices, usage=usage
        )


@dataclass(frozen=True)
class ChatFormat:
    request_id: str
    created: int
    model: str

    def opening(self) -> list[BaseModel]:
        """OpenAI's first chunk names the role and carries no text."""
        return [self._chunk([ChatChunkChoice(delta={"role": "assistant", "content": ""})], None)]

    def chunk(self, text: str, finish_reason: str | None) -> BaseModel:
        delta = {"content": text} if text else {}
        return self._chunk([ChatChunkChoice(delta=delta, finish_reason=finish_reason)], None)

    def usage_chunk(self, usage: Usage) -> BaseModel:
        return self._chunk([], usage)

    def response(self, final: RequestOutput) -> BaseModel:
        choice = ChatChoice(message=AssistantMessage(content=final.text), finish_reason=final.finish_reason)
        return ChatCompletionResponse(
            id=self.request_id,
            created=self.created,
            model=self.model,
            choices=[choice],
            usage=usage_of(final),
        )

    def _chunk(self, choices: list[ChatChunkChoice], usage: Usage | None) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.request_id, created=self.created, model=self.model, choices=choices, usage=usage
        )


async def openai_events(
    gen: Generation, first: RequestOutput, fmt: OpenAIFormat, include_usage: bool
) -> AsyncIterator[str]:
    """One chunk per output that has text (or finishes), the usage chunk if asked, `[DONE]`.

    An error after the stream started cannot change the status any more: it is sent as an
    `{"error": ...}` event (what OpenAI's client raises on), followed by `[DONE]`.
    """
    for opening in fmt.opening():
        yield sse_event(opening)
    out = first
    try:
        while True:
            if out.text_delta or out.finished:
                yield sse_event(fmt.chunk(out.text_delta, out.finish_reason if out.finished else None))
            if out.finished:
                break
            out = await gen.next()
    except Exception as e:
        yield sse_event(stream_error(e, gen.request_id))
        yield DONE_EVENT
        return
    if include_usage:
        yield sse_event(fmt.usage_chunk(usage_of(out)))
    yield DONE_EVENT
