"""Which routes need the API key: every one but those named open, so a route added later is
behind the key until someone opens it on purpose.

Open without the key: ``/health`` (the readiness probe), ``/metrics`` unless
``--metrics-require-key``, the API docs (``/openapi.json``, ``/docs``, ``/redoc``) only with
``--public-docs``, and the playground's page and files (``/``, ``/playground`` and each of its
files by name, ``playground.PATHS``): they hold no data, and the API calls the page makes carry
the key.
"""

from __future__ import annotations

from fastapi import FastAPI, Request

from omni_core.serve import playground
from omni_core.serve.errors import APIError

HEALTH = "/health"
METRICS = "/metrics"


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
                self.state.check_auth(Request(scope))
            except APIError as exc:
                return await exc.response()(scope, receive, send)
        await self.app(scope, receive, send)
