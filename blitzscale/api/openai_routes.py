"""OpenAI-compatible routes: `/v1/completions`, `/v1/chat/completions`, `/v1/models`.

Each route turns its body into prompt token ids and `SamplingParams`, then serves it the
same way: wait for the first output (a rejection is still a clean 4xx), then either stream
chunks or wait for the end.

`n` > 1 runs n backend requests, one per choice, under the ids `<id>-0` ... `<id>-<n-1>`;
with a seed, choice i is seeded `seed + i` (so each choice is reproducible on its own, and
`n=2, seed=s` gives the choices of `seed=s` and `seed=s+1`). Without a seed they are
independent draws; greedy choices are all the same, as in vLLM. Usage counts the prompt
once and every choice's tokens.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Awaitable

from fastapi import APIRouter, Request
from fastapi.responses import Response

from blitzscale.api import generation
from blitzscale.api.access_log import note_generations
from blitzscale.api.backend import ServingBackend
from blitzscale.api.chat_prompt import chat_message, chat_render, encode_chat, tool_prompt
from blitzscale.api.choices import ChoiceRefused, batch_error, start_all
from blitzscale.api.constraints import Constraint, check_grammar, constraint_of
from blitzscale.api.errors import ApiError
from blitzscale.api.generation import Generation
from blitzscale.api.metrics import ApiMetrics
from blitzscale.api.openai_format import ChatFormat, CompletionFormat, OpenAIFormat, openai_events
from blitzscale.api.prompts import completion_prompts, echoes_of, truncated
from blitzscale.api.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from blitzscale.api.reasoning import THINK_TAIL_TOKENS, opened_by, thinks
from blitzscale.api.responses import ModelCard, ModelList
from blitzscale.api.sse import EventStreamResponse
from blitzscale.api.tokenize import off_loop
from blitzscale.core.outputs import RequestOutput
from blitzscale.core.sampling import SamplingParams
from blitzscale.errors import InvalidRequestError

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
# Chat has no default in OpenAI's API ("until the context is full"); a cap keeps a request
# without max_tokens from holding KV blocks for thousands of tokens nobody asked for.
CHAT_DEFAULT_MAX_TOKENS_CAP = 1024


def openai_router(default: ServingBackend, metrics: ApiMetrics) -> APIRouter:
    """`default` serves requests that name no model, and finds the others' backends."""
    router = APIRouter()
    started = int(time.time())

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        arrival = time.perf_counter()
        backend = backend_for(default, body.model)
        check_features(body)
        texts, prompts = await completion_prompts(body, backend)
        max_tokens = body.max_tokens if body.max_tokens is not None else COMPLETION_DEFAULT_MAX_TOKENS
        for i, ids in enumerate(prompts):
            try:
                check_context(len(ids), max_tokens, backend.max_model_len, "max_tokens")
            except ApiError as e:
                if len(prompts) > 1:  # (which prompt leaves too little room)
                    raise ApiError(400, f"prompt[{i}]: {e.message}", param="max_tokens") from None
                raise
        request_id = f"cmpl-{uuid.uuid4().hex}"
        decode = backend.decode if body.logprobs is not None else None
        echoes = await echoes_of(body, texts, prompts, backend)
        prompt_only = bool(echoes) and body.max_tokens == 0
        if prompt_only and body.min_tokens:
            message = (
                "min_tokens cannot be combined with max_tokens 0 (echo: the prompt alone, nothing generated)"
            )
            raise ApiError(400, message, param="min_tokens")
        fmt = CompletionFormat(
            request_id, int(time.time()), backend.model_name, decode, body.num_choices, echoes, prompt_only
        )
        constraint = constraint_of(body)
        params = sampling_params(body, 1 if prompt_only else max_tokens, constraint)
        if echoes and body.logprobs is not None:
            params = dataclasses.replace(params, prompt_logprobs=body.logprobs)
        await check_grammar(backend, constraint)
        return await serve(request, backend, metrics, prompts, params, fmt, body, arrival)

    @router.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        arrival = time.perf_counter()
        backend = backend_for(default, body.model)
        check_features(body)
        messages = [chat_message(m, i) for i, m in enumerate(body.messages)]
        template = getattr(backend, "chat_template", None)
        render = chat_render(body, messages, template() if callable(template) else None)
        plan, (messages, tools) = await off_loop(tool_prompt, backend, body, messages)
        prompt_ids = await off_loop(encode_chat, backend, messages, tools, render)
        if body.truncate_prompt_tokens is not None:
            prompt_ids = truncated(
                prompt_ids, body.truncate_prompt_tokens, backend.max_model_len, "truncate_prompt_tokens"
            )
        given = next((v for v in (body.max_completion_tokens, body.max_tokens) if v is not None), None)
        if given is not None:
            name = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
            if given < 1:  # (named here: the engine's own check knows it as max_tokens)
                raise ApiError(400, f"{name} must be at least 1, got {given}", param=name)
            check_context(len(prompt_ids), given, backend.max_model_len, name)
        max_tokens = (
            given if given is not None else chat_default_max_tokens(len(prompt_ids), backend.max_model_len)
        )
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        decode = backend.decode if body.logprobs else None
        thinking = None  # (a model taught to think: is the reply inside its thinking from the start?)
        if thinks(template() if callable(template) else None):
            thinking = opened_by(await off_loop(backend.decode, prompt_ids[-THINK_TAIL_TOKENS:]))
        fmt = ChatFormat(request_id, int(time.time()), backend.model_name, decode, plan, thinking)
        constraint = plan.constraint() if plan is not None else None
        if constraint is not None:
            for each in plan.constrained():  # (each tool's schema alone first: a 400 names it)
                await check_grammar(backend, each)
        else:
            constraint = constraint_of(body)
        params = sampling_params(body, max_tokens, constraint)
        await check_grammar(backend, constraint)
        return await serve(request, backend, metrics, [prompt_ids], params, fmt, body, arrival)

    def card(backend: ServingBackend) -> ModelCard:
        root = getattr(backend, "model_root", None) or backend.model_name
        return ModelCard(
            id=backend.model_name, created=started, max_model_len=backend.max_model_len, root=root
        )

    @router.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[card(backend_for(default, name)) for name in served_names(default)])

    @router.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> ModelCard:
        return card(backend_for(default, model_id or "?"))

    return router


async def serve(
    request: Request,
    backend: ServingBackend,
    metrics: ApiMetrics,
    prompts: list[list[int]],
    params: SamplingParams,
    fmt: OpenAIFormat,
    body: SamplingFields,
    arrival: float,
) -> Response:
    """Run the request's `n` choices of each prompt (choice i is of prompt i // n, its
    index i % n among them); stream their chunks, or answer once all are done."""
    request_id = fmt.request_id
    n = body.num_choices
    total = n * len(prompts)
    check = getattr(backend, "validate", None)
    if len(prompts) > 1 and callable(check):  # (a batch is refused whole, before any prompt runs)
        for i, ids in enumerate(prompts):
            try:
                check(ids, params)
            except InvalidRequestError as e:
                raise batch_error(e, i, len(prompts)) from None
    ids = [request_id] if total == 1 else [f"{request_id}-{i}" for i in range(total)]

    stopping = generation.stopping_of(request)

    def one(i: int, rid: str) -> Awaitable[tuple[Generation, RequestOutput]]:
        p = choice_params(params, i % n)
        args = (rid, prompts[i // n], p, arrival, body.stream, stopping)
        return generation.start(request.receive, backend, metrics, *args)

    try:
        started = await start_all([one(i, rid) for i, rid in enumerate(ids)])
    except ChoiceRefused as e:
        raise e.error if len(prompts) == 1 else batch_error(e.error, e.index // n, len(prompts)) from None
    gens = [s[0] for s in started]
    firsts = [s[1] for s in started]
    note_generations(request.scope, gens, sum(map(len, prompts)))

    async def close() -> None:
        await asyncio.gather(*(g.close() for g in gens))

    headers = {"x-request-id": request_id}
    if body.stream:
        events = openai_events(gens, firsts, fmt, body.include_usage, body.continuous_usage)
        return EventStreamResponse(events, close, headers)
    try:
        finals = await asyncio.gather(
            *(generation.finish(request.receive, g, f) for g, f in zip(gens, firsts, strict=False))
        )
    finally:
        await close()
    content = fmt.response(finals).model_dump_json()
    return Response(content, media_type="application/json", headers=headers)


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    """Choice `index`'s parameters: seeded `seed + index` when a seed is given."""
    if index == 0 or params.seed is None:
        return params
    return dataclasses.replace(params, seed=params.seed + index)


def check_context(num_prompt_tokens: int, max_tokens: int, max_model_len: int, name: str) -> None:
    """A 400 for a request whose prompt plus `max_tokens` exceeds the context (as vLLM):
    never clamped, since the client would get less than it asked for without knowing."""
    if (
        max_tokens >= 1
        and num_prompt_tokens < max_model_len
        and num_prompt_tokens + max_tokens > max_model_len
    ):
        raise ApiError(
            400,
            f"{name} is {max_tokens} but this model's context is {max_model_len} tokens and the prompt "
            f"has {num_prompt_tokens}: at most {max_model_len - num_prompt_tokens} tokens can be generated",
            param=name,
        )


def check_model(model: str | None, model_name: str) -> None:
    """A 404 for a model name other than the one served (none given: the one served)."""
    if model and model != model_name:
        raise ApiError(
            404,
            f"the model {model!r} does not exist here; this server serves {model_name!r}",
            param="model",
            code="model_not_found",
        )


def served_names(backend: ServingBackend) -> list[str]:
    """Every model the backend serves (one unless it has `model_names()`)."""
    names = getattr(backend, "model_names", None)
    return list(names()) if callable(names) else [backend.model_name]


def backend_for(backend: ServingBackend, model: str | None) -> ServingBackend:
    """The backend of the model a request names (none: the default one); a name not
    served is a 404 naming it and what is served. A backend of several models has
    `for_model(name) -> ServingBackend | None` (the router); any other serves one."""
    pick = getattr(backend, "for_model", None)
    if not callable(pick):
        check_model(model, backend.model_name)
        return backend
    if not model:
        return backend
    chosen = pick(model)
    if chosen is None:
        served = ", ".join(repr(n) for n in served_names(backend))
        raise ApiError(
            404,
            f"the model {model!r} does not exist here; this server serves {served}",
            param="model",
            code="model_not_found",
        )
    return chosen  # type: ignore[no-any-return]


def check_features(body: SamplingFields) -> None:
    """What the backend cannot judge: features this server does not have (the model name is
    `backend_for`'s)."""
    constraint_of(body)  # (a response_format this server cannot give is refused here)
    if (field := body.unsupported_field()) is not None:
        raise ApiError(400, f"{field} is not supported by this server", param=field)
    if body.stream_options is not None and not body.stream:  # (as OpenAI: not ignored)
        raise ApiError(400, "stream_options is only allowed when stream is true", param="stream_options")
    if body.stream_options is not None and body.stream_options.include_obfuscation:
        name = "stream_options.include_obfuscation"
        raise ApiError(400, f"{name} is not supported by this server (it never pads chunks)", param=name)
    if (problem := body.logit_bias_error()) is not None:
        raise ApiError(400, problem, param="logit_bias")
    if isinstance(body, ChatCompletionRequest) and body.top_logprobs is not None and not body.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs set to true", param="top_logprobs")


def chat_default_max_tokens(num_prompt_tokens: int, max_model_len: int) -> int:
    """The rest of the context, capped; at least 1 so an over-long prompt is reported as such."""
    return max(1, min(max_model_len - num_prompt_tokens, CHAT_DEFAULT_MAX_TOKENS_CAP))


def sampling_params(
    body: SamplingFields, max_tokens: int, constraint: Constraint | None = None
) -> SamplingParams:
    def given(value: float | None, default: float) -> float:
        return default if value is None else value

    return SamplingParams(
        max_tokens=max_tokens,
        temperature=given(body.temperature, 1.0),
        top_p=given(body.top_p, 1.0),
        top_k=body.top_k or 0,
        min_p=given(body.min_p, 0.0),
        seed=body.seed,
        stop=body.stop_strings,
        stop_token_ids=tuple(body.stop_token_ids or ()),
        ignore_eos=body.ignore_eos,
        min_tokens=body.min_tokens or 0,
        logit_bias=tuple(sorted((body.logit_bias or {}).items())),
        repetition_penalty=given(body.repetition_penalty, 1.0),
        frequency_penalty=given(body.frequency_penalty, 0.0),
        presence_penalty=given(body.presence_penalty, 0.0),
        logprobs=body.top_logprobs_asked,
        grammar=None if constraint is None else constraint.grammar,
    )
