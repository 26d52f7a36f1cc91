"""/v1/audio/speech/stream on the test family with slow steps (a 300-character piece takes 25
steps of 400 ms), where an abort and a request left to finish differ: a client that leaves
mid-sentence has the sentence aborted in every stage; a drain tells an idle socket and closes it
rather than waiting its grace period for it."""

from __future__ import annotations

import json
import signal
import time

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.core.serve.server import API_KEY, ServerProcess, metric

ENDPOINT = "/v1/audio/speech/stream"


@pytest.fixture(scope="module")
def slow_server(testfamily_site, tmp_path_factory):
    proc = ServerProcess(
        testfamily_site,
        tmp_path_factory.mktemp("stream-abort"),
        "--api-key",
        API_KEY,
        "--drain-seconds",
        "30",
        step_ms=400,
    )
    try:
        yield proc.wait_ready()
    finally:
        assert proc.stop() == 0, proc.log()


def _busy(url: str) -> float:
    return metric(url, "omni_running_requests") + sum(
        metric(url, "omni_stage_requests", stage=s) for s in ("frontend", "tts", "listener")
    )


def _open(server):
    url = server.url.replace("http://", "ws://") + ENDPOINT
    return connect(url, additional_headers={"Authorization": f"Bearer {API_KEY}"}, open_timeout=30)


def test_leaving_mid_sentence_aborts_it_in_every_stage(slow_server):
    url = slow_server.url
    with _open(slow_server) as ws:
        ws.send(json.dumps({"type": "config", "model": "testfamily", "voice": "alloy"}))
        assert json.loads(ws.recv(timeout=30))["type"] == "ready"
        ws.send(json.dumps({"type": "text", "text": "many words " * 30}))  # no end: cut at 300 characters
        assert json.loads(ws.recv(timeout=30))["type"] == "sentence.start"
        assert isinstance(ws.recv(timeout=30), bytes)
        assert _busy(url) > 0
    deadline = time.monotonic() + 5  # well before the 10 s the piece would take to finish
    while _busy(url) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _busy(url) == 0, slow_server.log()
    assert metric(url, "omni_requests_aborted_total", endpoint=ENDPOINT) == 1


def test_a_drain_tells_an_idle_socket_and_closes_it(slow_server):  # last: it stops the server
    with _open(slow_server) as ws:
        ws.send(json.dumps({"type": "config", "model": "testfamily", "voice": "alloy"}))
        assert json.loads(ws.recv(timeout=30))["type"] == "ready"
        slow_server.process.send_signal(signal.SIGTERM)
        event = json.loads(ws.recv(timeout=10))
        assert event["type"] == "error" and event["error"]["code"] == "draining", event
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd.code == 1001
    # the socket held an admission slot: once it closed, the drain had nothing left to wait for
    assert slow_server.process.wait(timeout=20) == 0, slow_server.log()


def test_a_sentence_past_the_request_timeout_ends_with_an_error_event(testfamily_site, tmp_path):
    """A sentence is a request: --request-timeout bounds it as it bounds an HTTP request, and it
    is stopped in every stage, the socket staying open for the next."""
    server = ServerProcess(testfamily_site, tmp_path, "--api-key", API_KEY, "--request-timeout", "1", step_ms=400).wait_ready()
    try:
        with _open(server) as ws:
            ws.send(json.dumps({"type": "config", "model": "testfamily", "voice": "alloy"}))
            assert json.loads(ws.recv(timeout=30))["type"] == "ready"
            ws.send(json.dumps({"type": "text", "text": "many words " * 25 + "and that is all. "}))  # ~10 s of steps
            began = time.monotonic()
            events = []
            while not events or events[-1].get("type") != "error":
                message = ws.recv(timeout=30)
                if isinstance(message, str):
                    events.append(json.loads(message))
            assert events[-1]["error"]["code"] == "deadline_exceeded" and events[-1]["index"] == 0
            assert time.monotonic() - began < 8
            ws.send(json.dumps({"type": "end"}))
            assert json.loads(ws.recv(timeout=30))["type"] == "done"
        deadline = time.monotonic() + 5
        while _busy(server.url) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _busy(server.url) == 0
    finally:
        assert server.stop() == 0, server.log()
