"""Request deadlines on real `omni serve` processes: a request running past its deadline
(X-Request-Timeout, bounded by --request-timeout) is stopped in every stage and answered 504 in
OpenAI's shape, or ends its SSE stream with an error event; one still queued at its deadline
leaves the queue with a 504; each is counted in omni_requests_timed_out_total."""

from __future__ import annotations

import contextlib
import json

import httpx
import openai
import pytest
from omni_core.serve.deadline import request_timeout
from omni_core.serve.errors import APIError

from tests.core.serve.server import API_KEY, ServerProcess, metric
from tests.core.serve.test_errors_and_load import _wait_idle

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
SPEECH = "/v1/audio/speech"
# ~170 tts steps of 15 ms: 2.5 s of work, far longer than the deadlines below
LONG = "A sentence long enough to outlast its deadline. " * 40


def client(url: str, timeout_s: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, default_headers={"X-Request-Timeout": timeout_s}
    )


def test_a_request_past_its_deadline_gets_504_and_is_stopped_in_every_stage(api_server):
    url = api_server.url
    timed_out = metric(url, "omni_requests_timed_out_total", endpoint=SPEECH)
    gateway = metric(url, "omni_requests_total", endpoint=SPEECH, status="504")
    aborted = metric(url, "omni_requests_aborted_total", endpoint=SPEECH)
    with pytest.raises(openai.APIStatusError) as failed:
        client(url, "0.3").audio.speech.create(model="testfamily", voice="alloy", input=LONG[:2000], response_format="pcm")
    assert failed.value.status_code == 504
    assert failed.value.code == "deadline_exceeded" and failed.value.type == "server_error"
    assert "ran past its deadline" in failed.value.message
    # stopped, not left to finish: every stage is idle well before its 2.5 s of work would end
    _wait_idle(url, timeout_s=1.5)
    assert metric(url, "omni_requests_timed_out_total", endpoint=SPEECH) == timed_out + 1
    assert metric(url, "omni_requests_total", endpoint=SPEECH, status="504") == gateway + 1
    assert metric(url, "omni_requests_aborted_total", endpoint=SPEECH) == aborted  # timed out, not aborted
    # a deadline long enough changes nothing
    spoken = client(url, "30").audio.speech.create(model="testfamily", voice="alloy", input="in time", response_format="pcm")
    assert len(spoken.content) == len(b"in time") * 400 * 2


def test_a_stream_past_its_deadline_ends_with_an_error_event(api_server):
    url = api_server.url
    timed_out = metric(url, "omni_requests_timed_out_total", endpoint=SPEECH)
    body = {"model": "testfamily", "input": LONG[:2000], "voice": "alloy", "response_format": "pcm", "stream_format": "sse"}
    headers = {**HEADERS, "X-Request-Timeout": "0.5"}
    with httpx.stream("POST", f"{url}{SPEECH}", json=body, headers=headers, timeout=30) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events[0]["type"] == "speech.audio.delta"  # it was streaming when the deadline passed
    assert events[-1]["type"] == "error"
    assert events[-1]["error"]["code"] == "deadline_exceeded" and "ran past its deadline" in events[-1]["error"]["message"]
    _wait_idle(url, timeout_s=1.5)
    assert metric(url, "omni_requests_timed_out_total", endpoint=SPEECH) == timed_out + 1


def test_a_request_still_queued_at_its_deadline_leaves_the_queue_with_504(api_server):
    url = api_server.url
    # 6 MB of audio each, not read: more than the sockets buffer, so each stream holds its slot
    hold = {"model": "testfamily", "input": "Hold the slot. " * 130, "voice": "alloy", "speed": 0.25,
            "response_format": "pcm", "stream_format": "audio"}
    timed_out = metric(url, "omni_requests_timed_out_total", endpoint=SPEECH)
    aborted = metric(url, "omni_requests_aborted_total", endpoint=SPEECH)
    readers = []  # kept: a reader closed by the garbage collector would close its stream
    with httpx.Client(timeout=30) as http, contextlib.ExitStack() as streams:
        for _ in range(4):  # the server runs 4 at once
            r = streams.enter_context(http.stream("POST", f"{url}{SPEECH}", json=hold, headers=HEADERS))
            assert r.status_code == 200
            readers.append(r.iter_bytes())
            next(readers[-1])
        with pytest.raises(openai.APIStatusError) as failed:
            client(url, "0.4").audio.speech.create(model="testfamily", voice="alloy", input="queued", response_format="pcm")
        assert failed.value.status_code == 504 and failed.value.code == "deadline_exceeded"
        assert metric(url, "omni_queue_depth") == 0 and metric(url, "omni_running_requests") == 4
        assert metric(url, "omni_requests_timed_out_total", endpoint=SPEECH) == timed_out + 1
        assert metric(url, "omni_requests_aborted_total", endpoint=SPEECH) == aborted  # timed out, not aborted
    _wait_idle(url)


@pytest.mark.parametrize("value", ["soon", "0", "-2", "nan", "inf", "1e999"])
def test_a_bad_deadline_header_is_a_400_naming_it(api_server, value):
    r = httpx.post(f"{api_server.url}{SPEECH}", headers={**HEADERS, "X-Request-Timeout": value}, timeout=10,
                   json={"model": "testfamily", "input": "hello", "voice": "alloy"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "X-Request-Timeout" and error["code"] == "invalid_request_timeout"
    assert "positive number of seconds" in error["message"]


def test_the_header_is_bounded_by_the_servers_maximum():
    assert request_timeout(None, 600.0) == 600.0 and request_timeout(None, None) is None
    assert request_timeout("2.5", 600.0) == 2.5 and request_timeout("5000", 600.0) == 600.0
    assert request_timeout(" 7 ", None) == 7.0
    with pytest.raises(APIError):
        request_timeout("0", None)


def test_request_timeout_bounds_every_request_and_the_header_cannot_raise_it(testfamily_site, tmp_path):
    server = ServerProcess(testfamily_site, tmp_path, "--api-key", API_KEY, "--request-timeout", "0.5", step_ms=15)
    try:
        server.wait_ready()
        for headers in ({}, {"X-Request-Timeout": "60"}):  # 2.4 s of work each: 200 without the bound
            r = httpx.post(f"{server.url}{SPEECH}", headers={**HEADERS, **headers}, timeout=30,
                           json={"model": "testfamily", "input": LONG, "voice": "alloy", "response_format": "pcm"})
            assert r.status_code == 504 and r.json()["error"]["code"] == "deadline_exceeded", r.text
        assert metric(server.url, "omni_requests_timed_out_total", endpoint=SPEECH) == 2
    finally:
        assert server.stop() == 0, server.log()
