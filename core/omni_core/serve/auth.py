"""Which routes need the API key: every one but those named open, so a route added later is
behind the key until someone opens it on purpose.

Open without the key: ``/health`` (the readiness probe), ``/metrics`` unless
``--metrics-require-key``, the API docs (``/openapi.json``, ``/docs``, ``/redoc``) only with
``--public-docs``, and the playground's page and files (``/``, ``/playground`` and each of its
files by name, ``playground.PATHS``): they hold no data, and the API calls the page makes carry
the key.

WebSocket handshakes pass the same rule (the key as a bearer header, or in OpenAI's subprotocol
form ``openai-insecure-api-key.<key>`` that browsers can send), and one more: a handshake from a
web page of another origin is refused (403), with or without a key, since a socket, unlike a
``fetch``, is not held back by the browser's same-origin policy.
"""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit

from fastapi import FastAPI, Request, WebSocket

from omni_core.serve import playground
from omni_core.serve.errors import APIError

HEALTH = "/health"
METRICS = "/metrics"
# OpenAI's browser form: the key rides in Sec-WebSocket-Protocol, beside the "realtime" protocol
KEY_SUBPROTOCOL = "openai-insecure-api-key."


def bearer_key(headers) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header, None without one."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def key_matches(offered: str | None, expected: str) -> bool:
    return offered is not None and hmac.compare_digest(offered.encode(), expected.encode())


def check_http(request: Request, api_key: str | None) -> None:
    """``APIError`` 401 for a request without the key (when the server has one)."""
    if api_key and not key_matches(bearer_key(request.headers), api_key):
        raise APIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")


def offered_key(websocket: WebSocket) -> tuple[str | None, list[str]]:
    """The key a WebSocket client sent (bearer header or subprotocol) and its other subprotocols."""
    key = bearer_key(websocket.headers)
    others = []
    for protocol in websocket.scope.get("subprotocols", []):
        if protocol.startswith(KEY_SUBPROTOCOL):
            key = key or protocol[len(KEY_SUBPROTOCOL) :]
        else:
            others.append(protocol)
    return key, others


def check_websocket(websocket: WebSocket, api_key: str | None) -> None:
    """``APIError`` for a handshake from another origin's page (403) or without the key (401)."""
    origin = websocket.headers.get("origin")
    if origin and urlsplit(origin).netloc.lower() != websocket.headers.get("host", "").lower():
        raise APIError(
            403, f"a page of another origin ({origin}) may not open this socket", type="permission_error", code="cross_origin"
        )
    key, _ = offered_key(websocket)
    if api_key and not key_matches(key, api_key):
        raise APIError(
            401,
            f"Incorrect or missing API key: send 'Authorization: Bearer <key>' or the subprotocol '{KEY_SUBPROTOCOL}<key>'",
            code="invalid_api_key",
        )


def docs_paths(app: FastAPI) -> set[str]:
    """The paths FastAPI serves its API description and documentation pages on."""
    paths = {app.openapi_url, app.docs_url, app.redoc_url}
    if app.docs_url:
        paths.add(app.swagger_ui_oauth2_redirect_url)
    return {path for path in paths if path}


def open_paths(app: FastAPI, *, public_docs: bool, metrics_require_key: bool) -> frozenset[str]:
    paths = {HEALTH, *playground.PATHS}
    if not metrics_require_key:
        paths.add(METRICS)
    if public_docs:
        paths |= docs_paths(app)
    return frozenset(paths)


class AuthMiddleware:
    """Checks the API key before anything else runs (body parsing included) on every path not
    in ``open``; an unknown path is refused too (401 before 404), so it tells a caller nothing."""

    def __init__(self, app, state, open: frozenset[str]):
        self.app = app
        self.state = state
        self.open = open

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in self.open:
            try:
                check_http(Request(scope), self.state.config.api_key)
            except APIError as exc:
                return await exc.response()(scope, receive, send)
        elif scope["type"] == "websocket":
            websocket = WebSocket(scope, receive, send)
            try:
                check_websocket(websocket, self.state.config.api_key)
            except APIError as exc:
                return await websocket.send_denial_response(exc.response())
        await self.app(scope, receive, send)
