"""OpenAI-compatible routes: `/v1/completions`, `/v1/chat/completions`, `/v1/models`.

Each route turns its body into prompt token ids and `SamplingParams`, then serves it the
same way: wait for the first output (a rejection is still a clean 4xx), then either stream
chunks or wait for the end.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from blitzscale.api import generation
from blitzscale.api.backend import ServingBackend
from blitzscale.api.errors import ApiError
from blitzscale.api.metrics import ApiMetrics
from blitzscale.api.openai_format import ChatFormat, CompletionFormat, OpenAIFormat, openai_events
from blitzscale.api.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    ModelCard,
    ModelList,
    SamplingFields,
)
from blitzscale.api.sse import EventStreamResponse
from blitzscale.api.tokenize import off_loop
from blitzscale.engine.request import SamplingParams

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
# Chat has no default in OpenAI's API ("until the context is full"); a cap keeps a request
# without max_tokens from holding KV blocks for thousands of tokens nobody asked for.
CHAT_DEFAULT_MAX_TOKENS_CAP = 1024


def openai_router(backend: ServingBackend, metrics: ApiMetrics) -> APIRouter:
    router = APIRouter()
    started = int(time.time())

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        arrival = time.perf_counter()
        check_request(body, backend.model_name)
        prompt_ids = await completion_prompt_ids(body.prompt, backend)
        max_tokens = body.max_tokens if body.max_tokens is not None else COMPLETION_DEFAULT_MAX_TOKENS
        request_id = f"cmpl-{uuid.uuid4().hex}"
        fmt = CompletionFormat(request_id, int(time.time()), backend.model_name)
        params = sampling_params(body, max_tokens)
        return await serve(request, backend, metrics, prompt_ids, params, fmt, body, arrival)

    @router.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        arrival = time.perf_counter()
        check_request(body, backend.model_name)
        messages = [chat_message(m, i) for i, m in enumerate(body.messages)]
        prompt_ids = await off_loop(backend.encode_chat, messages)
        max_tokens = next(
            (v for v in (body.max_completion_tokens, body.max_tokens) if v is not None),
            chat_default_max_tokens(len(prompt_ids), backend.max_model_len),
        )
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        fmt = ChatFormat(request_id, int(time.time()), backend.model_name)
        params = sampling_params(body, max_tokens)
        return await serve(request, backend, metrics, prompt_ids, params, fmt, body, arrival)

    @router.get("/v1/models")
    async def models() -> ModelList:
        card = ModelCard(id=backend.model_name, created=started, max_model_len=backend.max_model_len)
        return ModelList(data=[card])

    return router


async def serve(
    request: Request,
    backend: ServingBackend,
    metrics: ApiMetrics,
    prompt_ids: list[int],
    params: SamplingParams,
    fmt: OpenAIFormat,
    body: SamplingFields,
    arrival: float,
) -> Response:
    request_id = fmt.request_id
    gen, first = await generation.start(
        request.receive, backend, metrics, request_id, prompt_ids, params, arrival
    )
    headers = {"x-request-id": request_id}
    if body.stream:
        events = openai_events(gen, first, fmt, body.include_usage)
        return EventStreamResponse(events, gen.close, headers)
    final = await generation.finish(request.receive, gen, first)
    content = fmt.response(final).model_dump_json()
    return Response(content, media_type="application/json", headers=headers)


def check_request(body: SamplingFields, model_name: str) -> None:
    """What the backend cannot judge: the model name, and features this server does not have."""
    if body.model and body.model != model_name:
        raise ApiError(
            404,
            f"the model {body.model!r} does not exist here; this server serves {model_name!r}",
            param="model",
            code="model_not_found",
        )
    if body.n not in (None, 1):
        raise ApiError(400, f"n must be 1 (one choice per request), got {body.n}", param="n")
    if (field := body.unsupported_field()) is not None:
        raise ApiError(400, f"{field} is not supported by this server", param=field)


Prompt = str | list[int] | list[str] | list[list[int]]


async def completion_prompt_ids(prompt: Prompt, backend: ServingBackend) -> list[int]:
    """Token ids of a prompt given as text, as token ids, or as a batch of exactly one."""
    if isinstance(prompt, str):
        if not prompt:  # tokenizers that add BOS would turn "" into a one-token prompt
            raise ApiError(400, "prompt is empty", param="prompt")
        return await off_loop(backend.encode, prompt)
    if prompt and not isinstance(prompt[0], int):
        if len(prompt) != 1:
            raise ApiError(400, f"send one prompt per request (got a batch of {len(prompt)})", param="prompt")
        return await completion_prompt_ids(prompt[0], backend)
    return [t for t in prompt if isinstance(t, int)]


def chat_message(message: ChatMessage, index: int) -> dict[str, Any]:
    """The plain dict `encode_chat` takes; content parts must all be text."""
    content = message.content
    if isinstance(content, list):
        if any(part.type != "text" or part.text is None for part in content):
            raise ApiError(400, "only text content parts are supported", param=f"messages[{index}].content")
        content = "".join(part.text or "" for part in content)
    out: dict[str, Any] = {"role": message.role, "content": content or ""}
    if message.name is not None:
        out["name"] = message.name
    return out


def chat_default_max_tokens(num_prompt_tokens: int, max_model_len: int) -> int:
    """The rest of the context, capped; at least 1 so an over-long prompt is reported as such."""
    return max(1, min(max_model_len - num_prompt_tokens, CHAT_DEFAULT_MAX_TOKENS_CAP))


def sampling_params(body: SamplingFields, max_tokens: int) -> SamplingParams:
    def given(value: float | None, default: float) -> float:
        return default if value is None else value

    return SamplingParams(
        max_tokens=max_tokens,
        temperature=given(body.temperature, 1.0),
        top_p=given(body.top_p, 1.0),
        top_k=body.top_k or 0,
        seed=body.seed,
        stop=body.stop_strings,
        stop_token_ids=tuple(body.stop_token_ids or ()),
        ignore_eos=body.ignore_eos,
    )
