"""Bodies the OpenAI (`/v1/...`) routes answer with: whole responses, stream chunks, usage,
logprobs and the model list (the requests' bodies: api/protocol.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer

from blitzscale.api.protocol import ToolCall, omit_empty


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> Usage:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy completions shape: parallel lists, one entry per token (with `echo`,
    the prompt's first: its first token has no logprob, null)."""

    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = []


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] = []


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    """A whole completion, and also each streamed chunk (OpenAI uses the same object)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None  # null when the reply is tool calls alone
    tool_calls: list[ToolCall] = []  # (left out when there are none, as OpenAI does)
    reasoning_content: str | None = None  # a thinking model's thinking (api/reasoning.py)

    @model_serializer(mode="wrap")
    def _without_no_calls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return omit_empty(handler(self), "tool_calls", "reasoning_content")


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatChunkChoice(BaseModel):
    index: int = 0
    # {"role": ..., "content": ...}, either, "tool_calls" (each with its "index"), or empty
    delta: dict[str, Any]
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "blitzscale"
    root: str | None = None  # the checkpoint's Hugging Face id where known (its tokenizer's name)
    parent: str | None = None
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
