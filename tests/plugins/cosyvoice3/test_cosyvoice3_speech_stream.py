"""End to end: /v1/audio/speech/stream on a real `omni serve --family cosyvoice3 --preset tiny`,
driven by the `websockets` client: text sent in pieces is spoken sentence by sentence (the first
sentence's audio arrives before the text ends), markers come in order around their audio, a
client that leaves mid-sentence frees the request in every stage, bad messages get error events
on a socket that goes on working, and the key and idle timeout apply. The tiny preset's audio is
noise: lengths and order are checked, not sound."""

from __future__ import annotations

import json
import time

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.core.serve.server import metric
from tests.helpers.server import OmniServer

KEY = "stream-key"
ENDPOINT = "/v1/audio/speech/stream"
CONFIG = {"type": "config", "model": "cosyvoice3", "voice": "default", "seed": 7}


@pytest.fixture(scope="module")
def server(tiny_dir, omni_cache, tmp_path_factory):
    proc = OmniServer(
        "cosyvoice3",
        tmp_path_factory.mktemp("cosyvoice3-stream"),
        "--preset",
        "tiny",
        "--api-key",
        KEY,
        "--option",
        "min_length_blocks=all",  # replies long enough to leave in the middle of one
        # a receive timeout shorter than the idle timeout: an open socket must outlive it
        "--receive-timeout",
        "1",
        "--socket-idle-timeout",
        "3",
        OMNI_PLUGINS="cosyvoice3",
        OMNI_CACHE=str(omni_cache),
        OMP_NUM_THREADS="1",
    )
    proc.wait_ready()
    yield proc
    proc.stop()


def _open(server, **kwargs):
    url = server.url.replace("http://", "ws://") + ENDPOINT
    kwargs.setdefault("additional_headers", {"Authorization": f"Bearer {KEY}"})
    return connect(url, open_timeout=30, close_timeout=5, **kwargs)


def _next(ws, timeout=60):
    message = ws.recv(timeout=timeout)
    return message if isinstance(message, bytes) else json.loads(message)


def _configured(ws):
    ws.send(json.dumps(CONFIG))
    ready = _next(ws)
    assert ready["type"] == "ready" and ready["response_format"] == "pcm" and ready["sample_rate"] > 0, ready
    return ready["sample_rate"]


def _until(ws, kind):
    """Messages up to and including the first event of ``kind``."""
    messages = []
    while True:
        messages.append(_next(ws))
        if isinstance(messages[-1], dict) and messages[-1]["type"] in (kind, "error"):
            return messages


def _check_sentence(messages, index, text, rate):
    """``messages`` are one sentence: its start, its audio, its done (with the audio's length)."""
    start, *audio, done = messages
    assert start == {"type": "sentence.start", "index": index, "text": text}, start
    assert audio and all(isinstance(chunk, bytes) for chunk in audio), done
    assert done["type"] == "sentence.done" and done["index"] == index, done
    samples = sum(len(chunk) for chunk in audio) // 2
    assert done["audio_seconds"] == pytest.approx(samples / rate, abs=1e-3)
    return samples


def test_sentences_speak_as_the_text_arrives(server):
    with _open(server) as ws:
        rate = _configured(ws)
        for piece in ("Hello ", "there, this is ", "the first sentence. ", "And then"):
            ws.send(json.dumps({"type": "text", "text": piece}))
        # the first sentence is spoken whole while the text is still open
        first = _until(ws, "sentence.done")
        total = _check_sentence(first, 0, "Hello there, this is the first sentence.", rate)
        ws.send(json.dumps({"type": "text", "text": " a second one! Last"}))
        ws.send(json.dumps({"type": "end"}))
        second = _until(ws, "sentence.done")
        total += _check_sentence(second, 1, "And then a second one!", rate)
        third = _until(ws, "sentence.done")
        total += _check_sentence(third, 2, "Last", rate)
        done = _next(ws)
        assert done == {
            "type": "done",
            "sentences": 3,
            "audio_seconds": pytest.approx(total / rate, abs=3e-3),
        }
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd.code == 1000


def test_a_client_that_leaves_mid_sentence_frees_its_work(server):
    aborted = metric(server.url, "omni_requests_aborted_total", endpoint=ENDPOINT)
    with _open(server) as ws:
        _configured(ws)
        # no sentence end: cut at the longest a piece may be, several of the family's segments long
        ws.send(json.dumps({"type": "text", "text": "speak these words one after another " * 10}))
        assert _next(ws)["type"] == "sentence.start"
        assert isinstance(_next(ws), bytes)  # speaking: its request holds state in the stages
    # as the HTTP API's disconnect test: within 10 s, where the whole piece takes far longer
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        freed = metric(server.url, "omni_running_requests") == 0 and all(
            metric(server.url, "omni_stage_requests", stage=stage) == 0 for stage in ("llm", "flow", "hift")
        )
        if freed and metric(server.url, "omni_requests_aborted_total", endpoint=ENDPOINT) == aborted + 1:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the request was not freed:\n{server.log()}")


def test_bad_messages_get_error_events_and_the_socket_goes_on(server):
    bad = [
        (b"\x00\x01", "invalid_message"),
        ("not json", "invalid_message"),
        ("[1, 2]", "invalid_message"),
        (json.dumps({"type": "speak"}), "unknown_message_type"),
        (json.dumps({"type": "text", "text": "too early. "}), "config_missing"),
        (json.dumps({**CONFIG, "model": "other"}), "model_not_found"),
        (json.dumps({**CONFIG, "speed": 9}), "invalid_config"),
        (json.dumps({**CONFIG, "response_format": "mp3"}), None),
        (json.dumps({**CONFIG, "voice": "nobody"}), None),
        (json.dumps({**CONFIG, "input": "text here"}), None),
    ]
    with _open(server) as ws:
        for message, code in bad:
            ws.send(message)
            event = _next(ws)
            assert event["type"] == "error" and event["error"]["message"], (message, event)
            if code is not None:
                assert event["error"]["code"] == code, (message, event)
        rate = _configured(ws)
        for message in (json.dumps(CONFIG), json.dumps({"type": "text", "text": 5})):
            ws.send(message)
            assert _next(ws)["type"] == "error"
        ws.send(json.dumps({"type": "text", "text": "Still here."}))
        ws.send(json.dumps({"type": "end"}))
        # sent before the last sentence is spoken: once it is, "done" comes and the socket closes
        ws.send(json.dumps({"type": "text", "text": "late"}))
        messages = []
        while not (isinstance(message := _next(ws), dict) and message["type"] == "done"):
            messages.append(message)
        refusals = [m for m in messages if isinstance(m, dict) and m["type"] == "error"]
        assert [r["error"]["code"] for r in refusals] == ["text_after_end"], refusals
        spoken = [m for m in messages if m not in refusals]
        _check_sentence(spoken, 0, "Still here.", rate)


def test_the_key_is_required_in_either_form(server):
    with pytest.raises(InvalidStatus) as refused:
        _open(server, additional_headers={})
    assert refused.value.response.status_code == 401
    assert json.loads(refused.value.response.body)["error"]["code"] == "invalid_api_key"
    with _open(
        server, additional_headers={}, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"]
    ) as ws:
        assert ws.subprotocol == "realtime"
        _configured(ws)


def test_an_idle_socket_is_told_and_closed(server):
    with _open(server) as ws:
        _configured(ws)
        started = time.monotonic()
        event = _next(ws, timeout=30)  # past --receive-timeout (1 s): the socket's own timeout rules
        assert event["type"] == "error" and event["error"]["code"] == "idle_timeout", event
        assert time.monotonic() - started > 2
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)


def test_realtime_transcription_is_refused_by_a_family_that_does_not_transcribe(server):
    # /v1/realtime opens speech sessions here; a transcription session is asked for by intent
    url = server.url.replace("http://", "ws://") + "/v1/realtime?model=cosyvoice3&intent=transcription"
    with pytest.raises(InvalidStatus) as refused:
        connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=30)
    assert refused.value.response.status_code == 400
    assert json.loads(refused.value.response.body)["error"]["code"] == "unsupported_task"
