"""Slow and surplus connections against a real `omni serve` (--receive-timeout 1
--max-connections 4), driven with raw sockets: half a request is dropped with a 408, an idle
connection is closed, a connection past the limit gets a 503, and a reply that takes longer than
the timeout to send is not cut by it."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tests.core.serve.server import ServerProcess

TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def server(testfamily_site, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("connection-limits")
    proc = ServerProcess(
        testfamily_site, workdir, "--receive-timeout", str(TIMEOUT_S), "--max-connections", "4", step_ms=15
    )
    try:
        yield proc.wait_ready()
    finally:
        assert proc.stop() == 0, proc.log()


def connect(server, data: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(data)
    return sock


def reply(sock: socket.socket) -> tuple[bytes, dict | None]:
    """(status line, JSON error body or None) of what the server sends before it closes."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    sock.close()
    head, _, body = received.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], (json.loads(body)["error"] if body else None)


def test_half_a_request_is_dropped_with_a_408_and_an_idle_connection_closed(server):
    started = time.monotonic()
    half_headers = connect(server, b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
    half_body = connect(
        server,
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"model": "testf',
    )
    idle = connect(server, b"")
    for sock in (half_headers, half_body):
        status, error = reply(sock)
        assert status == b"HTTP/1.1 408 Request Timeout"
        assert error["code"] == "request_timeout" and set(error) == {"message", "type", "param", "code"}
    assert reply(idle) == (b"", None)  # nothing was asked: nothing to answer
    assert TIMEOUT_S <= time.monotonic() - started < TIMEOUT_S + 3
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200


def test_a_connection_past_the_limit_gets_a_503_at_once(server):
    held = [connect(server, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half: ") for _ in range(4)]
    time.sleep(0.1)  # all four accepted
    started = time.monotonic()
    status, error = reply(connect(server, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
    assert status == b"HTTP/1.1 503 Service Unavailable" and error["code"] == "too_many_connections"
    assert time.monotonic() - started < TIMEOUT_S  # refused, not made to wait
    for sock in held:  # each dropped at the timeout, so the server takes connections again
        assert reply(sock)[0] == b"HTTP/1.1 408 Request Timeout"
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200


def test_a_reply_longer_than_the_timeout_is_not_cut(server):
    text = "A reply that takes longer to speak than the timeout. " * 16
    body = {"model": "testfamily", "input": text, "voice": "alloy", "response_format": "pcm", "stream_format": "audio"}
    started = time.monotonic()
    with httpx.stream("POST", f"{server.url}/v1/audio/speech", json=body, timeout=30) as r:
        received = sum(len(chunk) for chunk in r.iter_bytes())
    assert time.monotonic() - started > TIMEOUT_S
    assert received == len(text.encode()) * 400 * 2
