"""Hugging Face TGI-compatible routes: `/generate` and `/generate_stream`, with timing headers.

Both answer with `x-request-id` and TGI's timing headers in integer milliseconds, measured
at this API (see `timing.Timing`). `/generate` sends them all. `/generate_stream` sends its
headers once the first output arrived, before later tokens exist, so as a rule it can only
send `x-queue-time`, `x-first-token-time` and `x-request-id` (every header when the request
had already finished by then); the final event's `details.timings` (with `details: true`)
carries the complete set.
TGI's own errors are `{"error": str}`; ours keep the OpenAI shape on every route.
`/info` answers TGI's fields; `/generate`'s `details` carries `tokens` (each with its
logprob: such a request reads every step, like any request with logprobs; a stream's final
details have no tokens, as in TGI, so a stream is not slowed by asking) and, with
`decoder_input_details`, `prefill` (the prompt's ids, texts and logprobs, the first null).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence

from fastapi import APIRouter, Request
from fastapi.responses import Response

from blitzscale import __version__
from blitzscale.api import generation
from blitzscale.api.access_log import note_generations
from blitzscale.api.backend import ServingBackend
from blitzscale.api.constraints import check_grammar, tgi_constraint
from blitzscale.api.errors import ApiError, stream_error, tgi_error_body
from blitzscale.api.generation import Generation
from blitzscale.api.metrics import ApiMetrics
from blitzscale.api.openai_routes import check_context
from blitzscale.api.prompts import truncated
from blitzscale.api.sse import EventStreamResponse, sse_event
from blitzscale.api.tgi_protocol import (
    TGI_DEFAULT_MAX_NEW_TOKENS,
    TgiDetails,
    TgiFinishReason,
    TgiInfo,
    TgiParameters,
    TgiPrefillToken,
    TgiRequest,
    TgiResponse,
    TgiStreamEvent,
    TgiTimings,
    TgiToken,
)
from blitzscale.api.tokenize import off_loop
from blitzscale.core.outputs import RequestOutput, TokenLogprob
from blitzscale.core.sampling import SamplingParams

ABORTED_MESSAGE = "the server aborted the request before it finished"
MAX_NEW = "parameters.max_new_tokens"
VERSION = __version__  # also when run from a source tree, with no installed metadata


def tgi_router(backend: ServingBackend, metrics: ApiMetrics) -> APIRouter:
    router = APIRouter()

    async def prompt_of(body: TgiRequest) -> list[int]:
        """The input's tokens (with `truncate`, its last ones, as TGI)."""
        ids = await off_loop(backend.encode, body.inputs)
        if body.parameters.truncate is None:
            return ids
        return truncated(ids, body.parameters.truncate, backend.max_model_len, "parameters.truncate")

    async def start(body: TgiRequest, request: Request, stream: bool) -> tuple[Generation, RequestOutput]:
        arrival = time.perf_counter()
        if not body.inputs:
            raise ApiError(400, "inputs is empty", param="inputs")
        if (field := body.parameters.unsupported_field()) is not None:
            raise ApiError(
                400, f"parameters.{field} is not supported by this server", param=f"parameters.{field}"
            )
        if not body.add_special_tokens:
            message = "add_special_tokens=false is not supported by this server"
            raise ApiError(400, message, param="add_special_tokens")
        if body.stream is not None and body.stream != stream:
            route = "/generate_stream" if body.stream else "/generate"
            raise ApiError(400, f"stream is {str(body.stream).lower()}: send it to {route}", param="stream")
        if stream and body.parameters.decoder_input_details:  # (TGI refuses it too)
            message = "parameters.decoder_input_details is not supported when streaming tokens: use /generate"
            raise ApiError(400, message, param="parameters.decoder_input_details")
        temperature = body.parameters.temperature
        if body.parameters.do_sample and temperature is not None and temperature <= 0:
            message = f"parameters.temperature must be positive when do_sample is true, got {temperature:g}"
            raise ApiError(400, message, param="parameters.temperature")
        given = body.parameters.max_new_tokens
        if given is not None and given < 1:
            raise ApiError(400, f"parameters.max_new_tokens must be at least 1, got {given}", param=MAX_NEW)
        prompt_ids = await prompt_of(body)
        if given is not None:  # (never cut short: the client would get less than it asked)
            check_context(len(prompt_ids), given, backend.max_model_len, MAX_NEW)
        room = max(1, backend.max_model_len - len(prompt_ids))  # (the default fits the context)
        params = tgi_sampling_params(body.parameters, room)
        if (constraint := tgi_constraint(body.parameters.grammar)) is not None:
            await check_grammar(backend, constraint)
            params = dataclasses.replace(params, grammar=constraint.grammar)
        if body.parameters.wants_details and not stream:  # details.tokens carry each token's logprob
            params = dataclasses.replace(params, logprobs=0)  # (a stream's details have none)
        if body.parameters.top_n_tokens:  # each token's most likely alternatives, streamed or not
            params = dataclasses.replace(params, logprobs=body.parameters.top_n_tokens)
        if body.parameters.decoder_input_details:  # details.prefill: each prompt token's logprob
            params = dataclasses.replace(params, prompt_logprobs=0)
        request_id = f"gen-{uuid.uuid4().hex}"
        args = (request_id, prompt_ids, params, arrival, stream, generation.stopping_of(request))
        gen, first = await generation.start(request.receive, backend, metrics, *args)
        note_generations(request.scope, [gen])
        return gen, first

    @router.get("/info")
    async def info() -> TgiInfo:
        n = backend.max_model_len
        model_id = getattr(backend, "model_root", None) or backend.model_name
        return TgiInfo(
            model_id=model_id,
            max_input_tokens=n - 1,
            max_input_length=n - 1,
            max_total_tokens=n,
            version=VERSION,
        )

    @router.post("/generate")
    async def generate(body: TgiRequest, request: Request) -> Response:
        gen, first = await start(body, request, stream=False)
        final = await generation.finish(request.receive, gen, first)
        if final.finish_reason == "abort":
            raise ApiError(503, ABORTED_MESSAGE)
        prefix = body.inputs if body.parameters.return_full_text else ""
        details = None
        if body.parameters.wants_details:
            prefill = await prompt_of(body) if body.parameters.decoder_input_details else []
            details = await off_loop(full_details, tgi_details(final, gen), final, prefill, backend.decode)
        response = TgiResponse(generated_text=prefix + final.text, details=details)
        content = response.model_dump_json(exclude={"details"} if details is None else None)
        headers = gen.timing.tgi_headers(gen.request_id)
        return Response(content, media_type="application/json", headers=headers)

    @router.post("/generate_stream")
    async def generate_stream(body: TgiRequest, request: Request) -> Response:
        gen, first = await start(body, request, stream=True)
        prefix = body.inputs if body.parameters.return_full_text else ""
        headers = gen.timing.tgi_headers(gen.request_id)
        events = tgi_events(gen, first, prefix, body.parameters.details, backend.decode)
        return EventStreamResponse(events, gen.close, headers)

    @router.post("/")
    async def generate_at_root(body: TgiRequest, request: Request) -> Response:
        """TGI's route for clients that post to the server itself (huggingface_hub's
        `InferenceClient(base_url)`): `stream` in the body picks the kind of answer."""
        if body.stream:
            return await generate_stream(body, request)
        return await generate(body, request)

    return router


def tgi_sampling_params(p: TgiParameters, room: int | None = None) -> SamplingParams:
    """`room`: the tokens the context leaves after the prompt (the default max_new_tokens
    is capped by it; one given was checked against it)."""
    stop = (p.stop,) if isinstance(p.stop, str) else tuple(p.stop or ())
    default = TGI_DEFAULT_MAX_NEW_TOKENS if room is None else min(TGI_DEFAULT_MAX_NEW_TOKENS, room)
    max_tokens = p.max_new_tokens if p.max_new_tokens is not None else default
    penalties = {
        "repetition_penalty": 1.0 if p.repetition_penalty is None else p.repetition_penalty,
        "frequency_penalty": p.frequency_penalty or 0.0,
    }
    if not p.is_sampling:
        # greedy: the seed changes nothing, but it is checked like any other value
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0,
            seed=p.seed,
            stop=stop,
            ignore_eos=p.ignore_eos,
            **penalties,
        )
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if p.temperature is None else p.temperature,
        top_p=1.0 if p.top_p is None else p.top_p,
        top_k=p.top_k or 0,
        seed=p.seed,
        stop=stop,
        ignore_eos=p.ignore_eos,
        **penalties,
    )


def full_details(
    details: TgiDetails, final: RequestOutput, prefill: list[int], decode: Callable[[list[int]], str]
) -> TgiDetails:
    """`details` with `tokens` (each generated token, its text and logprob) and `prefill`
    (the prompt's tokens, with decoder_input_details); runs on the tokenizer's thread."""
    lps = [lp.logprob for lp in final.logprobs]
    lps += [None] * (len(final.token_ids) - len(lps))  # type: ignore[list-item]
    details.tokens = [
        TgiToken(id=t, text=decode([t]), logprob=lp) for t, lp in zip(final.token_ids, lps, strict=False)
    ]
    if n := top_n(final.logprobs):
        details.top_tokens = [top_tokens(lp, n, decode) for lp in final.logprobs]
    prompt_lps = [None, *(lp.logprob for lp in final.prompt_logprobs)]  # (the first has none)
    prompt_lps += [None] * (len(prefill) - len(prompt_lps))
    details.prefill = [
        TgiPrefillToken(id=t, text=decode([t]), logprob=lp)
        for t, lp in zip(prefill, prompt_lps, strict=False)
    ]
    return details


def top_n(logprobs: Sequence[TokenLogprob]) -> int:
    """How many alternatives a request's tokens carry (its `top_n_tokens`; 0: none asked)."""
    return max((len(lp.top) for lp in logprobs), default=0)


def top_tokens(lp: TokenLogprob, n: int, decode: Callable[[list[int]], str]) -> list[TgiToken]:
    """A position's `n` most likely tokens (TGI's `top_tokens`), most likely first."""
    return [TgiToken(id=t, text=decode([t]), logprob=x) for t, x in lp.top[:n]]


def tgi_finish_reason(out: RequestOutput, params: SamplingParams) -> TgiFinishReason:
    """TGI tells EOS from a stop string; our outputs say "stop" for both, so a "stop" of a
    request that had stop strings is reported as `stop_sequence` (it may have been EOS)."""
    if out.finish_reason == "length":
        return "length"
    return "stop_sequence" if params.stop or params.stop_token_ids else "eos_token"


def tgi_details(final: RequestOutput, gen: Generation) -> TgiDetails:
    return TgiDetails(
        finish_reason=tgi_finish_reason(final, gen.params),
        generated_tokens=len(final.token_ids),
        input_length=final.num_prompt_tokens,
        seed=gen.params.seed,
        timings=TgiTimings(**gen.timing.tgi_timings_ms()),
    )


def token_events(
    out: RequestOutput,
    gen: Generation,
    prefix: str,
    index: int,
    details: bool,
    decode: Callable[[list[int]], str] | None = None,
) -> list[TgiStreamEvent]:
    """TGI sends one event per token. An output of k tokens becomes k events, its text on the
    last (the text of one token alone may not decode); the last event of the request carries
    `generated_text`, and `details` when asked (as TGI). Text that came without a token (only
    possible at the end) goes out on a placeholder `special` token with id -1."""
    lps: list[float | None] = [lp.logprob for lp in out.logprobs]
    if len(lps) != len(out.new_token_ids):
        lps = [None] * len(out.new_token_ids)
    tokens = [TgiToken(id=t, text="", logprob=lp) for t, lp in zip(out.new_token_ids, lps, strict=True)]
    if not tokens and (out.text_delta or out.finished):
        tokens = [TgiToken(id=-1, text="", special=True)]
    if not tokens:
        return []
    tokens[-1].text = out.text_delta
    events = [TgiStreamEvent(index=index + i + 1, token=tok) for i, tok in enumerate(tokens)]
    if decode is not None and (n := top_n(out.logprobs)) and len(out.logprobs) == len(out.new_token_ids):
        for event, lp in zip(events, out.logprobs, strict=False):
            event.top_tokens = top_tokens(lp, n, decode)
    if out.finished:
        events[-1].generated_text = prefix + out.text
        events[-1].details = tgi_details(out, gen) if details else None
    return events


async def tgi_events(
    gen: Generation,
    first: RequestOutput,
    prefix: str,
    details: bool,
    decode: Callable[[list[int]], str] | None = None,
) -> AsyncIterator[str]:
    """The token events of a request (`details` on the last where asked); a failure after the
    start is one `{"error": ...}` event."""
    index = 0
    out = first
    try:
        while True:
            if out.finished and out.finish_reason == "abort":
                yield sse_event(tgi_error_body(503, ABORTED_MESSAGE))
                return
            for event in token_events(out, gen, prefix, index, details, decode):
                index = event.index
                yield sse_event(event)
            if out.finished:
                return
            out = await gen.next()
    except Exception as e:
        yield sse_event(stream_error(e, gen.request_id, tgi_error_body))
