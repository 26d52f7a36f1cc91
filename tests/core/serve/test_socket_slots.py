"""A WebSocket holds an admission slot while it is open: a handshake whose client left while it
waited in the admission queue gives its slot back when it is admitted (its accept fails), a
client that closes its socket ends it without an error in the server's log, and a realtime
socket whose session cannot be made (server VAD's model fails to load) is told why, closed and
gives its slot back. Against a real `omni serve` with one running slot, so a slot that leaked
would refuse every later socket."""

from __future__ import annotations

import json
import socket
import time

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.core.serve.server import API_KEY, ServerProcess, metric
from tests.helpers.server import OmniServer

ENDPOINT = "/v1/audio/speech/stream"
HEADERS = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def server(testfamily_site, tmp_path_factory):
    proc = ServerProcess(
        testfamily_site, tmp_path_factory.mktemp("socket-slots"), "--api-key", API_KEY, "--max-running", "1"
    )
    try:
        yield proc.wait_ready()
    finally:
        assert proc.stop() == 0, proc.log()


def _until(check, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)
    return check()


def _handshake(port: int) -> socket.socket:
    """A raw WebSocket handshake that is left waiting (nobody reads its answer)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(
        f"GET {ENDPOINT} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Authorization: Bearer {API_KEY}\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    return sock


def test_a_handshake_whose_client_left_in_the_queue_gives_its_slot_back(server):
    url = server.url.replace("http://", "ws://") + ENDPOINT
    with connect(url, additional_headers=HEADERS):  # takes the one slot
        assert _until(lambda: metric(server.url, "omni_running_requests") == 1)
        waiting = _handshake(server.port)
        assert _until(lambda: metric(server.url, "omni_queue_depth") == 1)
        waiting.close()  # its client leaves while it waits
    # the slot comes free, the waiting handshake takes it, finds its client gone and gives it back
    assert _until(
        lambda: metric(server.url, "omni_running_requests") == 0 and metric(server.url, "omni_queue_depth") == 0
    ), server.log()
    with connect(url, additional_headers=HEADERS) as ws:  # the one slot serves the next socket
        ws.send(json.dumps({"type": "config", "model": "testfamily", "voice": "alloy"}))
        assert json.loads(ws.recv(timeout=30))["type"] == "ready"
    assert _until(lambda: metric(server.url, "omni_running_requests") == 0)
    assert "Exception in ASGI application" not in server.log()


@pytest.fixture(scope="module")
def broken_vad_server(testfamily_site, tmp_path_factory):
    """One running slot, and a silero-vad whose model file is damaged: onnxruntime fails to load
    it (not the missing extra, which turns server VAD off) when a realtime session is made."""
    pytest.importorskip("onnxruntime", reason="server VAD runs on onnxruntime (omni-core's realtime extra)")
    workdir = tmp_path_factory.mktemp("broken-vad")
    data = workdir / "site" / "silero_vad" / "data"
    data.mkdir(parents=True)
    (data.parent / "__init__.py").write_text("")
    (data / "__init__.py").write_text("")
    (data / "silero_vad.onnx").write_bytes(b"not an onnx model")
    proc = OmniServer(
        "testfamily", workdir, "--preset", "tiny", "--api-key", API_KEY, "--max-running", "1",
        site=(workdir / "site", testfamily_site), OMNI_PLUGINS="testfamily", OMNI_TESTFAMILY_STEP_MS="0",
    )
    try:
        yield proc.wait_ready(90)
    finally:
        assert proc.stop() == 0, proc.log()


def test_a_realtime_socket_whose_session_cannot_be_made_gives_its_slot_back(broken_vad_server):
    server = broken_vad_server
    url = server.url.replace("http://", "ws://") + "/v1/realtime?model=testfamily"
    for _ in range(2):  # a leaked slot would keep the second out
        with connect(url, additional_headers=HEADERS, open_timeout=10) as ws:
            event = json.loads(ws.recv(timeout=30))
            assert event["type"] == "error" and event["error"]["code"] == "server_error", event
            assert "INVALID_PROTOBUF" in event["error"]["message"]
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=30)
            assert closed.value.rcvd.code == 1011
        assert _until(lambda: metric(server.url, "omni_running_requests") == 0), server.log()
    url = server.url.replace("http://", "ws://") + ENDPOINT
    with connect(url, additional_headers=HEADERS) as ws:  # the one slot serves the next socket
        ws.send(json.dumps({"type": "config", "model": "testfamily", "voice": "alloy"}))
        assert json.loads(ws.recv(timeout=30))["type"] == "ready"
    assert "Exception in ASGI application" not in server.log()
