"""Every error leaves the API as an OpenAI-style body: `{"error": {message, type, param, code}}`.

FastAPI's defaults (422 with a list of pydantic errors, `{"detail": ...}` for 404s) are
replaced here, so a client sees one shape and the status OpenAI's own API would give. The
TGI routes use the same shape (one format to parse; TGI's own is `{"error": str}`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from blitzscale.errors import InvalidRequestError, OverloadedError, RequestFailedError, UnavailableError

log = logging.getLogger(__name__)

# The status nginx logs for "client closed the connection before the response": nobody reads
# it, but the request counter shows how many requests were abandoned.
CLIENT_CLOSED_STATUS = 499

_TYPE_BY_STATUS = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}
FASTAPI_BODY_ERROR = "There was an error parsing the body"  # a body json.loads refused otherwise


class ApiError(Exception):
    """An error the API answers on purpose, with its HTTP status and OpenAI error fields."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


class ClientDisconnected(Exception):
    """The client closed the connection while the request was still being served."""


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """The JSON body of an error response (also the payload of an SSE error event)."""
    kind = "server_error" if status >= 500 else _TYPE_BY_STATUS.get(status, "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None) -> Response:
    return JSONResponse(error_body(status, message, param, code), status_code=status)


# TGI's routes answer errors in TGI's own shape, as text-generation-inference does, so its
# clients (huggingface_hub's InferenceClient) read them: {"error": text, "error_type": kind}.
TGI_PATHS = frozenset({"/", "/generate", "/generate_stream", "/info"})
TGI_VALIDATION_STATUS = 422  # TGI's status for a request it refuses (ours elsewhere: 400)


def tgi_error_body(status: int, message: str) -> dict:
    if status in (429, 503):
        kind = "overloaded"
    elif status >= 500:
        kind = "generation"
    else:
        kind = "validation"
    return {"error": message, "error_type": kind}


def _respond(
    request: Request, status: int, message: str, param: str | None = None, code: str | None = None
) -> Response:
    """The error in the shape of the API the request came to."""
    if request.url.path in TGI_PATHS:  # (no param field there: the message names it)
        text = message if param is None or param in message else f"{param}: {message}"
        status = TGI_VALIDATION_STATUS if status == 400 else status
        return JSONResponse(tgi_error_body(status, text), status_code=status)
    return error_response(status, message, param, code)


def _field_path(loc: Sequence[Any]) -> str:
    """`messages[0].content` from pydantic's loc, without "body" and union member tags."""
    parts = [p for p in loc if p != "body" and not (isinstance(p, str) and _is_type_tag(p))]
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".")


def _is_type_tag(part: str) -> bool:
    """A union member's tag in pydantic's loc (`list[str]`, `function-after[...]`), not a
    field or dict key (`logit_bias`'s keys are token ids: digits)."""
    named = part.isidentifier() or part.isdigit()
    return not named or part in {"str", "int", "float", "bool", "list", "dict", "none"}


def describe_validation_error(errors: Sequence[dict[str, Any]]) -> tuple[str, str | None]:
    """(message, param) for pydantic's errors: the first field that failed, named as `a.b[0]`;
    a union field lists what each of its alternatives expected."""
    if not errors:
        return "invalid request body", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return f"malformed JSON body: {detail}".rstrip(": "), None
    if first.get("type") == "invalid_unicode":  # (protocol.ApiRequest: the field is in ctx)
        return first.get("msg", "invalid Unicode"), (first.get("ctx") or {}).get("path")
    param = _field_path(first.get("loc", ()))
    msgs = dict.fromkeys(
        e.get("msg", "invalid value") for e in errors if _field_path(e.get("loc", ())) == param
    )
    text = " or ".join(msgs)
    if not param:
        return f"request body: {text}", None
    return f"{param}: {text}", param


def status_of(exc: Exception) -> int | None:
    """The HTTP status of an error the backend raises on purpose (None: a bug)."""
    if isinstance(exc, InvalidRequestError):
        return 400
    if isinstance(exc, OverloadedError):
        return 429
    if isinstance(exc, UnavailableError):
        return 503
    if isinstance(exc, RequestFailedError):
        return 500
    return None


def stream_error(exc: Exception, request_id: str, body: Callable[[int, str], dict] = error_body) -> dict:
    """The error event for a failure after a stream started, when the status is already
    sent (`body`: the API's shape, OpenAI's or TGI's)."""
    status = status_of(exc)
    if status is not None:
        if status >= 500:
            log.warning("request %s failed mid-stream: %s", request_id, exc)
        return body(status, str(exc))
    log.error("request %s failed mid-stream: %r", request_id, exc)
    return body(500, f"internal server error ({type(exc).__name__})")


async def _backend_error(request: Request, exc: Exception) -> Response:
    """Failures the backend reports on purpose: their own status and message, no traceback."""
    status = status_of(exc) or 500
    response = _respond(request, status, str(exc), code="overloaded" if status == 429 else None)
    if isinstance(exc, UnavailableError):
        response.headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    return response


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return _respond(request, exc.status, exc.message, exc.param, exc.code)


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if request.method == "POST" and kind and kind != "application/json" and not kind.endswith("+json"):
        # (FastAPI leaves such a body unparsed: "Input should be a valid dictionary" says less)
        return _respond(
            request, 415, f"the body must be JSON sent as Content-Type application/json, not {kind}"
        )
    message, param = describe_validation_error(exc.errors())
    return _respond(request, 400, message, param)


async def _invalid_request(request: Request, exc: Exception) -> Response:
    param = getattr(exc, "param", None)
    if param == "prompt" and request.url.path.endswith("/chat/completions"):
        param = "messages"  # (the backend names the prompt; a chat request sends messages)
    return _respond(request, 400, str(exc), param)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Routing errors (unknown path, wrong method) and any HTTPException raised by FastAPI."""
    assert isinstance(exc, StarletteHTTPException)
    where = f"{request.method} {request.url.path}"
    if exc.status_code == 404:
        message = f"{where}: no such endpoint"
    elif exc.status_code == 405:
        message = f"{where}: method not allowed"
    elif exc.status_code == 400 and exc.detail == FASTAPI_BODY_ERROR:  # (its text says no more)
        message = "the request body could not be read as JSON: it must be UTF-8 text, nested not too deeply"
    else:
        message = str(exc.detail)
    return _respond(request, exc.status_code, message)


async def _client_gone(_request: Request, _exc: Exception) -> Response:
    return Response(status_code=CLIENT_CLOSED_STATUS)


async def _unexpected(request: Request, exc: Exception) -> Response:
    """Starlette still re-raises after this, so the server logs the traceback."""
    log.error("unhandled %s in the API: %s", type(exc).__name__, exc)
    return _respond(request, 500, f"internal server error ({type(exc).__name__})")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(InvalidRequestError, _invalid_request)
    app.add_exception_handler(UnavailableError, _backend_error)
    app.add_exception_handler(RequestFailedError, _backend_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(ClientDisconnected, _client_gone)
    app.add_exception_handler(Exception, _unexpected)
