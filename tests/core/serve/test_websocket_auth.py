"""WebSocket handshakes pass the HTTP API's key rule in AuthMiddleware, so a socket route added
later is behind the key too, and a page of another origin cannot open a socket (a browser does
not hold a WebSocket back as it holds back a cross-origin fetch's reply)."""

from __future__ import annotations

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.core.serve.server import API_KEY

BEARER = {"Authorization": f"Bearer {API_KEY}"}


def _status(url: str, **options) -> int:
    """The handshake's HTTP status: 101 when the socket opened."""
    try:
        with connect(url, open_timeout=30, **options):
            return 101
    except InvalidStatus as exc:
        return exc.response.status_code


@pytest.fixture
def ws(api_server):
    return api_server.url.replace("http://", "ws://")


def test_a_socket_path_without_the_key_is_refused_even_where_no_route_is(ws):
    assert _status(f"{ws}/v1/no-such-socket") == 401
    assert _status(f"{ws}/v1/audio/speech/stream") == 401
    assert _status(f"{ws}/v1/audio/speech/stream", additional_headers=BEARER) == 101
    assert _status(f"{ws}/v1/audio/speech/stream", subprotocols=[f"openai-insecure-api-key.{API_KEY}"]) == 101


def test_a_page_of_another_origin_may_not_open_a_socket(ws, api_server):
    own = api_server.url
    assert _status(f"{ws}/v1/audio/speech/stream", additional_headers=BEARER, origin="http://elsewhere.example") == 403
    assert _status(f"{ws}/v1/audio/speech/stream", additional_headers=BEARER, origin=own) == 101
