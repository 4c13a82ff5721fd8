"""`create_app`: the FastAPI application of the HTTP edge, over any `ServingBackend`.

Layers, outermost first: the access log (when given), request counting (sees every
answer, 401s included), the API key check (when a key is set), the body size limit (413),
FastAPI's routing with our error handlers, then the OpenAI, TGI, tokenizer and operations
routes. The app keeps no state of its own beyond its metrics: requests live in the
backend, and each in-flight request's outputs are owned by its `Generation`.
"""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from blitzscale.api.access_log import AccessLogMiddleware
from blitzscale.api.backend import ServingBackend
from blitzscale.api.errors import install_error_handlers
from blitzscale.api.metrics import ApiMetrics
from blitzscale.api.middleware import (
    DEFAULT_MAX_BODY_BYTES,
    ApiKeyMiddleware,
    BodyLimitMiddleware,
    RequestCounterMiddleware,
)
from blitzscale.api.openai_routes import openai_router
from blitzscale.api.tgi_routes import tgi_router
from blitzscale.api.tokenizer_routes import tokenizer_router

# Probes and scrapers hold no key: these stay open when an API key is set.
OPEN_PATHS = frozenset({"/health", "/metrics"})


def create_app(
    backend: ServingBackend,
    *,
    api_key: str | None = None,
    registry: CollectorRegistry | None = None,
    metrics: ApiMetrics | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    access_log: logging.Logger | None = None,
) -> FastAPI:
    """An app serving `backend`. `/metrics` exposes `registry` (the router registers its own
    metrics there too); the API's metrics go to `metrics`, or to a new `ApiMetrics` in
    `registry`, or, with neither given, in a registry of this app's own. `access_log`: a
    logger for one line per request (api/access_log.py), outermost of all."""
    if api_key is not None and not api_key:
        raise ValueError("api_key is empty: pass None to serve without a key")
    if metrics is None:
        metrics = ApiMetrics(registry if registry is not None else CollectorRegistry())
    if registry is None:
        registry = metrics.registry
    app = FastAPI(title="BlitzScale", summary="OpenAI- and TGI-compatible LLM serving")
    # set when the server stops serving: requests still running end with a 503 (api/generation.py)
    app.state.stopping = asyncio.Event()
    install_error_handlers(app)
    routers = [
        openai_router(backend, metrics),
        tgi_router(backend, metrics),
        tokenizer_router(backend),
        ops_router(backend, registry),
    ]
    for router in routers:
        app.include_router(router)
    # metric labels: our route paths and FastAPI's own (/docs...); any other path is "unmatched"
    routes = [*app.routes, *(route for router in routers for route in router.routes)]
    endpoints = frozenset(path for route in routes if isinstance(path := getattr(route, "path", None), str))
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)  # inside the key check
    if api_key is not None:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key, open_paths=OPEN_PATHS)
    app.add_middleware(RequestCounterMiddleware, metrics=metrics, endpoints=endpoints)
    if access_log is not None:
        app.add_middleware(AccessLogMiddleware, logger=access_log)  # outermost: sees every answer
    return app


def ops_router(backend: ServingBackend, registry: CollectorRegistry) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health() -> Response:
        """200 while the backend can serve; 503 (same body) when it says it cannot."""
        body = backend.health()
        return JSONResponse(body, status_code=200 if body.get("status", "ok") == "ok" else 503)

    @router.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @router.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> Response:
        """As vLLM's: every serving engine forgets its cached prefixes (requests in
        flight keep the blocks they hold); benchmark clients call it between runs."""
        told = await backend.reset_prefix_cache()
        return JSONResponse({"status": "ok", "instances": told})

    return router
