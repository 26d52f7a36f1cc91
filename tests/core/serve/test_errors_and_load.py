"""Bad requests, overload and disconnects against the shared real server: every error in
OpenAI's shape with the right status, nothing left running afterwards, /metrics in agreement."""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import json
import socket
import time
from urllib.parse import urlsplit

import httpx
import pytest

from tests.core.serve.server import API_KEY, metric, tone_wav
from tests.core.serve.test_codecs_and_store import silent_flac

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
SPEECH = "/v1/audio/speech"
TRANSCRIPTIONS = "/v1/audio/transcriptions"
CHAT = "/v1/chat/completions"


def speech(**fields):
    return {"json": {"model": "testfamily", "input": "hello", "voice": "alloy", **fields}}


def upload(data: bytes, **fields):
    return {"data": {"model": "testfamily", **fields}, "files": {"file": ("a.wav", data, "audio/wav")}}


def raw_json(text: str):
    """A JSON body sent as written (json.dumps would not let a lone surrogate through)."""
    return {"content": text.encode(), "headers": {"content-type": "application/json"}}


def chat_part(part):
    return {"json": {"model": "testfamily", "messages": [{"role": "user", "content": [part]}]}}


BAD_REQUESTS = [
    ("unknown voice", SPEECH, speech(voice="nobody"), 400, "voice"),
    ("aac has no encoder", SPEECH, speech(response_format="aac"), 400, "response_format"),
    ("unknown format", SPEECH, speech(response_format="ogg"), 400, "response_format"),
    ("empty input", SPEECH, speech(input="   "), 400, "input"),
    ("speed out of range", SPEECH, speech(speed=9), 400, "speed"),
    ("input too long", SPEECH, speech(input="a" * 2001), 413, "input"),
    ("unknown model", SPEECH, speech(model="gpt-4o-mini-tts"), 404, "model"),
    (
        "reference is not audio",
        SPEECH,
        speech(voice=None, reference_audio=base64.b64encode(b"nope" * 50).decode()),
        400,
        "reference_audio",
    ),
    ("reference is not base64", SPEECH, speech(reference_audio="%%%"), 400, "reference_audio"),
    ("reference is empty", SPEECH, speech(voice=None, reference_audio=""), 400, "reference_audio"),
    ("instructions too long", SPEECH, speech(instructions="a" * 2001), 413, "instructions"),
    (
        "reference_text too long",
        SPEECH,
        speech(voice=None, reference_audio=base64.b64encode(tone_wav(1.0)).decode(), reference_text="a" * 2001),
        413,
        "reference_text",
    ),
    ("lone surrogate in input", SPEECH, raw_json('{"model": "testfamily", "input": "\\ud800abc", "voice": "alloy"}'), 400, "input"),
    (
        "lone surrogate in instructions",
        SPEECH,
        raw_json('{"model": "testfamily", "input": "hi", "voice": "alloy", "instructions": "\\udfffx"}'),
        400,
        "instructions",
    ),
    (
        "lone surrogate in chat",
        CHAT,
        raw_json('{"model": "testfamily", "messages": [{"role": "user", "content": "\\ud800"}]}'),
        400,
        "messages[0].content",
    ),
    ("not json", SPEECH, {"content": b"{nope", "headers": {"content-type": "application/json"}}, 400, None),
    ("undecodable upload", TRANSCRIPTIONS, upload(b"RIFF not really a wav file" * 10), 400, "file"),
    ("upload too large", TRANSCRIPTIONS, upload(b"\0" * (1024 * 1024 + 200_000)), 413, "file"),
    ("audio too long", TRANSCRIPTIONS, upload(tone_wav(25.0, rate=8000)), 413, "file"),
    ("compressed audio too long", TRANSCRIPTIONS, upload(silent_flac(3600)), 413, "file"),
    (
        "timestamp granularities without verbose_json",
        TRANSCRIPTIONS,
        upload(tone_wav(1.0), **{"timestamp_granularities[]": "word"}),
        400,
        "timestamp_granularities",
    ),
    ("no file", TRANSCRIPTIONS, {"data": {"model": "testfamily"}}, 400, "file"),
    (
        "bad response_format",
        TRANSCRIPTIONS,
        upload(tone_wav(1.0), response_format="docx"),
        400,
        "response_format",
    ),
    ("bad temperature", TRANSCRIPTIONS, upload(tone_wav(1.0), temperature="hot"), 400, "temperature"),
    (
        "chat audio not base64",
        CHAT,
        chat_part({"type": "input_audio", "input_audio": {"data": "@@", "format": "wav"}}),
        400,
        "messages[0].content[0].input_audio.data",
    ),
    (
        "chat remote image",
        CHAT,
        chat_part({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}),
        400,
        "messages[0].content[0].image_url.url",
    ),
    (
        "chat unknown part",
        CHAT,
        chat_part({"type": "video", "video": "x"}),
        400,
        "messages[0].content[0].type",
    ),
    (
        # the offline API's part that takes a file path: over HTTP the server reads no file of its own
        "chat local audio path",
        CHAT,
        chat_part({"type": "audio", "audio": "/etc/hostname", "sample_rate": 16000}),
        400,
        "messages[0].content[0].type",
    ),
    ("chat no messages", CHAT, {"json": {"model": "testfamily", "messages": []}}, 400, "messages"),
]


@pytest.mark.parametrize(
    ("path", "kwargs", "status", "param"),
    [case[1:] for case in BAD_REQUESTS],
    ids=[case[0] for case in BAD_REQUESTS],
)
def test_bad_request_gets_openai_error(api_server, path, kwargs, status, param):
    before = metric(api_server.url, "omni_requests_total", endpoint=path, status=str(status))
    r = httpx.post(
        f"{api_server.url}{path}", headers={**HEADERS, **kwargs.pop("headers", {})}, timeout=30, **kwargs
    )
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    assert metric(api_server.url, "omni_requests_total", endpoint=path, status=str(status)) == before + 1
    assert metric(api_server.url, "omni_running_requests") == 0


def test_api_key(api_server):
    body = speech()["json"]
    missing = httpx.post(f"{api_server.url}{SPEECH}", json=body, timeout=10)
    wrong = httpx.post(
        f"{api_server.url}{SPEECH}", json=body, headers={"Authorization": "Bearer nope"}, timeout=10
    )
    for r in (missing, wrong):
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{api_server.url}/v1/models", timeout=10).status_code == 401
    assert httpx.get(f"{api_server.url}/health", timeout=10).status_code == 200  # probes stay open


def test_a_method_not_allowed_says_which_are(api_server):
    # /v1/audio/voices is served by two routes (GET and POST): the Allow names both
    cases = (("GET", SPEECH, "POST"), ("DELETE", "/health", "GET"), ("PUT", "/v1/audio/voices", "GET, POST"))
    for method, path, allowed in cases:
        r = httpx.request(method, f"{api_server.url}{path}", headers=HEADERS, timeout=10)
        assert r.status_code == 405 and r.headers.get("allow") == allowed, (method, path, r.headers)
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def _stream_speech(client: httpx.Client, url: str, text: str) -> tuple[int, int, str | None]:
    """(status, bytes received, Retry-After) of one streamed speech request."""
    body = {
        "model": "testfamily",
        "input": text,
        "voice": "echo",
        "response_format": "pcm",
        "stream_format": "audio",
    }
    with client.stream("POST", f"{url}{SPEECH}", json=body, headers=HEADERS) as r:
        received = sum(len(chunk) for chunk in r.iter_bytes())
        return r.status_code, received, r.headers.get("retry-after")


def test_32_simultaneous_streams_complete_or_429(api_server):
    url = api_server.url
    text = "Thirty two voices at once, each one streamed. " * 2
    expected_bytes = len(text.encode()) * 400 * 2
    before = {s: metric(url, "omni_requests_total", endpoint=SPEECH, status=s) for s in ("200", "429")}
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=0)
    with httpx.Client(timeout=httpx.Timeout(60.0), limits=limits) as client:
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            futures = [pool.submit(_stream_speech, client, url, text) for _ in range(32)]
            results = [f.result(timeout=120) for f in futures]  # none may hang
    ok = [r for r in results if r[0] == 200]
    busy = [r for r in results if r[0] == 429]
    assert len(ok) + len(busy) == 32
    assert all(received == expected_bytes for _, received, _ in ok)  # every admitted stream completes
    assert all(retry is not None and int(retry) >= 1 for _, _, retry in busy)
    assert len(ok) >= 4 and busy  # 4 run + 8 queue: the rest must be turned away
    assert metric(url, "omni_requests_total", endpoint=SPEECH, status="200") - before["200"] == len(ok)
    assert metric(url, "omni_requests_total", endpoint=SPEECH, status="429") - before["429"] == len(busy)
    assert metric(url, "omni_queue_depth") == 0
    _wait_idle(url)  # no slot and no stage state left behind


def _wait_idle(url: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy = metric(url, "omni_running_requests") + sum(
            metric(url, "omni_stage_requests", stage=s) for s in ("frontend", "tts", "listener")
        )
        if busy == 0:
            return
        time.sleep(0.05)
    raise AssertionError("requests still held by the server or a stage after the client left")


def test_client_disconnect_aborts_in_every_stage(api_server):
    url = api_server.url
    long_text = "A long sentence that takes a while to speak. " * 40  # ~150 tts steps of 15 ms
    aborted = metric(url, "omni_requests_aborted_total", endpoint=SPEECH)
    body = {
        "model": "testfamily",
        "input": long_text,
        "voice": "alloy",
        "response_format": "pcm",
        "stream_format": "audio",
    }
    with httpx.stream("POST", f"{url}{SPEECH}", json=body, headers=HEADERS, timeout=30) as r:
        assert r.status_code == 200
        next(r.iter_bytes())  # audio is flowing; now leave
    _wait_idle(url)
    assert metric(url, "omni_requests_aborted_total", endpoint=SPEECH) == aborted + 1
    # a non-streaming request whose client gives up is aborted the same way
    body.pop("stream_format")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}{SPEECH}", json=body, headers=HEADERS, timeout=httpx.Timeout(30.0, read=0.3))
    _wait_idle(url)
    assert metric(url, "omni_requests_aborted_total", endpoint=SPEECH) == aborted + 2


def test_a_client_cutting_a_raw_stream_is_one_info_line_not_a_traceback(api_server):
    log_from = len(api_server.log_path.read_text())
    body = json.dumps(speech(input="Long enough to be cut mid-way. " * 30, response_format="pcm", stream_format="audio")["json"])
    with socket.create_connection(("127.0.0.1", api_server.port), timeout=30) as sock:
        sock.sendall(
            f"POST {SPEECH} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode()
        )
        received = b""
        while len(received) < 20000:  # headers and some audio: the stream is under way
            received += sock.recv(65536)
        assert received.startswith(b"HTTP/1.1 200")
    _wait_idle(api_server.url)
    deadline = time.monotonic() + 5
    while "the client left" not in api_server.log_path.read_text()[log_from:] and time.monotonic() < deadline:
        time.sleep(0.05)
    log = api_server.log_path.read_text()[log_from:]
    left = [line for line in log.splitlines() if "the client left" in line]
    assert len(left) == 1 and " INFO omni.serve: /v1/audio/speech: the client left after " in left[0], log
    assert "Traceback" not in log and "Exception in ASGI" not in log, log


def test_upload_without_a_length_is_refused_once_past_the_limit(api_server):
    """A chunked upload states no Content-Length: its body must stop being received at the limit
    (1 MB here), not be spooled whole before the size is known."""
    url = urlsplit(api_server.url)
    boundary = "omniboundary"
    head = (
        f"POST {TRANSCRIPTIONS} HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {API_KEY}\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    part = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n"
    ).encode()
    chunk = b"\0" * 65536
    sent, reply = 0, b""
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(head.encode() + b"%x\r\n%s\r\n" % (len(part), part))
        try:
            while sent < 64 * 1024 * 1024 and not reply:  # at most 64 MB: far past the limit
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
                sock.settimeout(0.0)
                try:
                    reply = sock.recv(65536)
                except BlockingIOError:
                    pass
                sock.settimeout(30)
        except (BrokenPipeError, ConnectionResetError):
            pass
        sock.settimeout(30)
        while b"\r\n\r\n" not in reply:
            more = sock.recv(65536)
            if not more:
                break
            reply += more
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    # answered while the client was still sending (what it sent past the limit sits in socket buffers)
    assert sent < 32 * 1024 * 1024
    assert metric(api_server.url, "omni_running_requests") == 0


def test_deleting_a_voice_id_no_voice_could_have_is_a_404(api_server):
    for voice_id in ("voice_" + "a" * 300, "voice_..", "voice_0123456789abcdeg"):
        r = httpx.delete(f"{api_server.url}/v1/audio/voices/{voice_id}", headers=HEADERS, timeout=10)
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", r.text


@pytest.mark.parametrize("chunked", [False, True], ids=["with a length", "chunked"])
def test_a_json_body_past_the_limit_is_refused_before_it_is_parsed(api_server, chunked):
    # the server takes 1 MB uploads, so 2.5 MB of JSON (an upload's worth of base64 and text)
    # (a field the endpoint ignores: parsed, the body would be a valid request)
    body = b'{"model": "testfamily", "voice": "alloy", "input": "hi", "padding": "' + b"a" * (3 * 2**20) + b'"}'
    content = iter([body[i : i + 2**16] for i in range(0, len(body), 2**16)]) if chunked else body
    r = httpx.post(f"{api_server.url}{SPEECH}", content=content, headers={**HEADERS, "content-type": "application/json"}, timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large", r.text
    assert metric(api_server.url, "omni_running_requests") == 0
    assert httpx.post(f"{api_server.url}{SPEECH}", headers=HEADERS, timeout=30, **speech()).status_code == 200


def test_a_queued_request_whose_client_leaves_gives_its_place_up(api_server):
    url = api_server.url
    # 6 MB of audio each, not read: more than the sockets buffer, so each stream holds its slot
    body = {"model": "testfamily", "input": "Hold the slot. " * 130, "voice": "alloy", "speed": 0.25,
            "response_format": "pcm", "stream_format": "audio"}
    readers = []  # kept: a reader closed by the garbage collector would close its stream
    aborted = metric(url, "omni_requests_aborted_total", endpoint=SPEECH)
    left = metric(url, "omni_requests_total", endpoint=SPEECH, status="499")
    with httpx.Client(timeout=30) as client, contextlib.ExitStack() as streams:
        for _ in range(4):  # the server runs 4 at once
            r = streams.enter_context(client.stream("POST", f"{url}{SPEECH}", json=body, headers=HEADERS))
            assert r.status_code == 200
            readers.append(r.iter_bytes())
            next(readers[-1])
        assert metric(url, "omni_running_requests") == 4
        with pytest.raises(httpx.ReadTimeout):  # queued behind them; its client gives up
            httpx.post(f"{url}{SPEECH}", headers=HEADERS, timeout=httpx.Timeout(30.0, read=0.5), **speech())
        deadline = time.monotonic() + 5
        while metric(url, "omni_queue_depth") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert metric(url, "omni_queue_depth") == 0  # while the 4 still run
        assert metric(url, "omni_running_requests") == 4
        # it never ran, yet it was aborted: counted as such (and as a 499)
        assert metric(url, "omni_requests_aborted_total", endpoint=SPEECH) == aborted + 1
        assert metric(url, "omni_requests_total", endpoint=SPEECH, status="499") == left + 1
    _wait_idle(url)
    assert metric(url, "omni_requests_aborted_total", endpoint=SPEECH) == aborted + 5  # and the 4 left
    assert httpx.post(f"{url}{SPEECH}", headers=HEADERS, timeout=30, **speech()).status_code == 200
