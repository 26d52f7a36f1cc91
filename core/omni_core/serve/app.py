"""The FastAPI application: a thin HTTP layer over an ``Omni`` runtime.

``create_app(config, loader)`` returns an app that answers /health with 503 while ``loader()``
builds the runtime in a background thread, then serves the OpenAI-shaped endpoints.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from omni_core import __version__
from omni_core.serve import chat, info, playground, speech, transcriptions, voices
from omni_core.serve.auth import AuthMiddleware, open_paths
from omni_core.serve.errors import APIError, QuietStreamCuts, install_error_handlers
from omni_core.serve.metrics import MetricsMiddleware
from omni_core.serve.openapi import install_openapi
from omni_core.serve.realtime import endpoint as realtime_endpoint
from omni_core.serve.realtime import speech_stream
from omni_core.serve.state import ServeConfig, ServerState
from omni_core.serve.streaming import ClientGone

log = logging.getLogger("omni.serve")


class JsonBodyLimitMiddleware:
    """Refuses (413) a JSON body on /v1 past ``limit()`` bytes before anything parses it: a body is
    read whole into memory and parsed (JSON, then pydantic), so one huge request could exhaust the
    server. Multipart uploads have their own limit (``transcriptions.read_upload``)."""

    def __init__(self, app, limit: Callable[[], int]):
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/v1/") or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if headers.get(b"content-type", b"").startswith(b"multipart/"):
            return await self.app(scope, receive, send)
        limit = self.limit()
        declared = headers.get(b"content-length", b"")
        too_large = APIError(413, f"request body exceeds {limit} bytes", param=None, code="too_large")
        if declared.isdigit() and int(declared) > limit:
            return await too_large.response()(scope, receive, send)
        body, size, more = [], 0, True  # read here (the app reads it whole anyway), counting as it comes
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left
            body.append(message.get("body", b""))
            size += len(body[-1])
            more = message.get("more_body", False)
            if size > limit:
                return await too_large.response()(scope, receive, send)
        replay = [{"type": "http.request", "body": b"".join(body), "more_body": False}]

        async def replayed():
            return replay.pop() if replay else await receive()

        await self.app(scope, replayed, send)


def create_app(
    config: ServeConfig,
    loader: Callable[[], Any],
    on_load_failed: Callable[[str], None] | None = None,
    on_fatal: Callable[[str], None] | None = None,
) -> FastAPI:
    """``on_fatal(reason)``: called once when a loaded runtime can serve no more (its Ray cluster
    lost); the requests it held have failed, new ones get 503, and the command ends the server."""
    state = ServerState(config)

    async def watch_runtime() -> None:
        while state.fatal_error is None:
            await asyncio.sleep(0.25)
            lost = state.omni.lost if state.omni is not None else None
            if lost:
                state.fatal_error = lost
                if on_fatal is not None:
                    on_fatal(lost)

    def load() -> None:
        try:
            state.omni = loader()
        except BaseException as exc:  # report it on /health and to the command, never hang
            state.load_error = f"{type(exc).__name__}: {exc}"
            log.error("loading %s failed: %s", config.family, state.load_error)
            if on_load_failed is not None:
                on_load_failed(state.load_error)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        thread = threading.Thread(target=load, name="omni-load", daemon=True)
        thread.start()
        quiet = QuietStreamCuts()
        logging.getLogger("uvicorn.error").addFilter(quiet)  # here: after uvicorn set its logging up
        watching = asyncio.ensure_future(watch_runtime())
        try:
            yield
        finally:
            watching.cancel()
            await state.drain(0.0)
            thread.join(timeout=1)
            if state.omni is not None:
                state.omni.shutdown()
            logging.getLogger("uvicorn.error").removeFilter(quiet)

    app = FastAPI(title="omni", version=__version__, lifespan=lifespan)
    app.state.omni_state = state
    install_error_handlers(app)

    @app.exception_handler(ClientGone)
    async def _client_gone(request: Request, exc: ClientGone):
        return Response(status_code=499)  # nobody reads it; it labels the request in /metrics

    for module in (speech, transcriptions, chat, voices, info):
        app.include_router(module.router)
    app.include_router(info.open_router)
    # the sockets check the API key themselves: the middleware sees HTTP only
    app.include_router(speech_stream.router)
    app.include_router(realtime_endpoint.router)
    app.include_router(playground.router)
    # a JSON body carries at most an upload's worth of base64 audio (4/3 of its bytes) and text
    app.add_middleware(JsonBodyLimitMiddleware, limit=lambda: int(config.limits.max_upload_mb * 2**20 * 1.5) + 2**20)
    opened = open_paths(app, public_docs=config.public_docs, metrics_require_key=config.metrics_require_key)
    install_openapi(app, keyed=config.api_key is not None, open_paths=opened)
    app.add_middleware(AuthMiddleware, state=state, open=opened)
    app.add_middleware(MetricsMiddleware, metrics_getter=lambda: state.metrics)  # outermost: counts 401s too
    return app
