"""The API key rule, checked on every route the app has (read from its router, so a route added
later is checked too): with --api-key every route needs the key but /health, /metrics (unless
--metrics-require-key), the API docs (only with --public-docs) and the playground's page and
files, each by its name (any other path under /playground/ needs the key)."""

from __future__ import annotations

import re

import httpx
import pytest
from omni_core.serve import playground
from omni_core.serve.app import create_app
from omni_core.serve.state import ServeConfig

from tests.core.serve.server import API_KEY, ServerProcess

DOCS = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}


def every_route() -> list[tuple[str, str]]:
    """(method, path) of every route of the app, path parameters filled in."""
    app = create_app(ServeConfig(family="testfamily", served_model_name="testfamily"), loader=lambda: None)
    try:  # FastAPI 0.16x keeps included routers whole in app.routes
        from fastapi.routing import iter_route_contexts
    except ImportError:  # earlier ones copy their routes there
        iter_route_contexts = list
    routes = []
    for route in iter_route_contexts(app.routes):
        path = re.sub(r"\{[^}]+\}", "voice_0123456789abcdef", route.path)
        routes += [(method, path) for method in sorted(getattr(route, "methods", None) or {"GET"})]
    return routes


def is_open(path: str, *, public_docs: bool, metrics_require_key: bool) -> bool:
    return (
        path == "/health"
        or path in playground.PATHS
        or (path == "/metrics" and not metrics_require_key)
        or (public_docs and path in DOCS)
    )


def check_every_route(url: str, **rule: bool) -> None:
    routes = every_route()
    assert {path for _, path in routes} >= DOCS | {"/health", "/metrics", "/v1/audio/speech"}
    wrong_key = {"Authorization": "Bearer not-the-key"}
    pages = [("GET", path) for path in sorted(playground.PATHS)]
    assert {"/", "/playground", "/playground/main.js", "/playground/style.css"} <= playground.PATHS
    for method, path in [*routes, *pages, ("GET", "/no/such/route"), ("GET", "/playground/no-such-file.js")]:
        without = httpx.request(method, url + path, timeout=30)
        wrong = httpx.request(method, url + path, headers=wrong_key, timeout=30)
        right = httpx.request(method, url + path, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30)
        if is_open(path, **rule):
            assert without.status_code != 401 and wrong.status_code != 401, (method, path)
        else:
            for refused in (without, wrong):
                assert refused.status_code == 401, (method, path, refused.status_code)
                assert method == "HEAD" or refused.json()["error"]["code"] == "invalid_api_key"
        assert right.status_code != 401, (method, path)


def test_every_route_needs_the_key_but_health_and_metrics(api_server):
    check_every_route(api_server.url, public_docs=False, metrics_require_key=False)


@pytest.fixture(scope="module")
def docs_open_metrics_closed(testfamily_site, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("auth-rule")
    proc = ServerProcess(testfamily_site, workdir, "--api-key", API_KEY, "--public-docs", "--metrics-require-key")
    try:
        yield proc.wait_ready()
    finally:
        assert proc.stop() == 0, proc.log()


def test_public_docs_and_metrics_behind_the_key(docs_open_metrics_closed):
    check_every_route(docs_open_metrics_closed.url, public_docs=True, metrics_require_key=True)
    assert "/v1/audio/speech" in httpx.get(f"{docs_open_metrics_closed.url}/openapi.json", timeout=10).json()["paths"]
