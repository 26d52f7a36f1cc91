"""End to end: /v1/realtime transcription sessions on a real `omni serve --family whisper` (the
bundled tiny.en weights), driven by the official `openai` SDK's realtime client: espeak-ng
sentences streamed in 100 ms pcm16 chunks at real time with pauses between them are split into
one turn each by server VAD (Silero) and transcribed as well as POST /v1/audio/transcriptions
transcribes the same audio; commits by hand, bad events, and the handshake's refusals."""

from __future__ import annotations

import base64
import io
import json
import re
import time

import jiwer
import numpy as np
import openai
import pytest
import soundfile as sf
import soxr
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.core.serve.server import metric
from tests.helpers.realtime_events import events_until
from tests.helpers.server import OmniServer

pytest.importorskip("silero_vad", reason="server VAD needs omni-core's realtime extra")

KEY = "realtime-key"
SESSION_RATE = 24000  # OpenAI's pcm rate: resampled to 16 kHz by the server
CHUNK_S = 0.1
PAUSE_S = 0.8


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = OmniServer(
        "whisper", tmp_path_factory.mktemp("whisper-realtime"), "--api-key", KEY, OMNI_PLUGINS="whisper"
    )
    proc.wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=60)


def _words(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]", " ", text.lower()).split())


def _pcm16(wav: bytes, rate: int) -> bytes:
    samples, source_rate = sf.read(io.BytesIO(wav), dtype="float32")
    samples = soxr.resample(samples, source_rate, rate)
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


def _append(connection, pcm: bytes) -> None:
    connection.input_audio_buffer.append(audio=base64.b64encode(pcm).decode())



@pytest.mark.timeout(180)
def test_server_vad_splits_spoken_sentences_into_turns(client, spoken, sentences):
    chosen = [0, 5, 7]
    step = int(SESSION_RATE * CHUNK_S) * 2  # bytes a 100 ms chunk
    silence = bytes(int(SESSION_RATE * PAUSE_S) * 2)
    audio = silence + b"".join(_pcm16(spoken[i], SESSION_RATE) + silence for i in chosen)
    with client.realtime.connect(model="whisper") as connection:
        created = connection.recv()
        assert created.type == "session.created"
        connection.session.update(
            session={
                "type": "transcription",
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcm", "rate": SESSION_RATE},
                        "transcription": {"language": "en"},
                        "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                    }
                },
            }
        )
        updated = connection.recv()
        assert updated.type == "session.updated", updated
        started = time.monotonic()
        for n, offset in enumerate(range(0, len(audio), step)):  # at real time, as a microphone sends
            time.sleep(max(0.0, started + n * CHUNK_S - time.monotonic()))
            _append(connection, audio[offset : offset + step])
        turns: dict[str, dict] = {}
        order = []
        while len([t for t in turns.values() if "transcript" in t]) < len(chosen):
            event = connection.recv()
            assert event.type != "error", event
            if event.type == "input_audio_buffer.speech_started":
                order.append(event.item_id)
                turns[event.item_id] = {"start_ms": event.audio_start_ms, "deltas": ""}
            elif event.type == "input_audio_buffer.speech_stopped":
                turns[event.item_id]["end_ms"] = event.audio_end_ms
            elif event.type == "input_audio_buffer.committed":
                assert "end_ms" in turns[event.item_id]
            elif event.type == "conversation.item.input_audio_transcription.delta":
                turns[event.item_id]["deltas"] += event.delta
            elif event.type == "conversation.item.input_audio_transcription.completed":
                turns[event.item_id]["transcript"] = event.transcript
                assert event.usage.type == "duration" and event.usage.seconds > 0.5
    assert len(order) == len(chosen), turns  # one turn a sentence: the pauses split them, nothing else does
    spans = [(turns[i]["start_ms"], turns[i]["end_ms"]) for i in order]
    assert all(a_end < b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False)), spans
    texts = [turns[i]["transcript"] for i in order]
    assert all(_words(turns[i]["deltas"]) == _words(turns[i]["transcript"]) for i in order), turns
    expected = [_words(sentences[i]) for i in chosen]
    realtime_wer = jiwer.wer(expected, [_words(t) for t in texts])
    http = [
        client.audio.transcriptions.create(model="whisper", file=("s.wav", spoken[i])).text for i in chosen
    ]
    http_wer = jiwer.wer(expected, [_words(t) for t in http])
    assert realtime_wer <= http_wer, (texts, http)


def test_commit_by_hand_clear_and_an_empty_commit(client, spoken, sentences):
    with client.realtime.connect(model="whisper") as connection:
        assert connection.recv().type == "session.created"
        connection.session.update(
            session={
                "type": "transcription",
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None}},
            }
        )
        session = connection.recv().session
        assert session.audio.input.turn_detection is None and session.audio.input.format.rate == 16000
        connection.input_audio_buffer.commit()
        refused = connection.recv()
        assert refused.type == "error" and refused.error.code == "input_audio_buffer_commit_empty"
        _append(connection, _pcm16(spoken[2], 16000)[:16000])
        connection.input_audio_buffer.clear()
        assert connection.recv().type == "input_audio_buffer.cleared"
        pcm = _pcm16(spoken[2], 16000)
        for offset in range(0, len(pcm), 3200):
            _append(connection, pcm[offset : offset + 3200])
        connection.input_audio_buffer.commit()
        events = events_until(connection, "conversation.item.input_audio_transcription.completed")
        kinds = [e.type for e in events]
        assert kinds[:3] == [
            "input_audio_buffer.committed",
            "conversation.item.added",
            "conversation.item.done",
        ]
        assert "error" not in kinds, kinds
        added = events[1].item
        assert (
            added.id == events[0].item_id and added.role == "user" and added.content[0].type == "input_audio"
        )
        assert events[-1].item_id == events[0].item_id
        assert _words(events[-1].transcript) == _words(sentences[2])  # the cleared audio is not in it


def _raw(server, **headers):
    url = server.url.replace("http://", "ws://") + "/v1/realtime?model=whisper"
    return connect(url, additional_headers={"Authorization": f"Bearer {KEY}", **headers}, open_timeout=30)


def test_bad_events_get_error_events_and_change_nothing(server, client, spoken):
    bad = [
        b"\x00binary",
        "not json",
        json.dumps({"type": "response.create"}),
        json.dumps({"type": "input_audio_buffer.append", "audio": "%%%"}),
        json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()}),
        json.dumps({"type": "input_audio_buffer.append"}),
        json.dumps({"type": "session.update", "session": {"type": "realtime"}}),
        json.dumps(
            {"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcmu"}}}}}
        ),
        json.dumps(
            {
                "type": "session.update",
                "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 100}}}},
            }
        ),
        json.dumps(
            {
                "type": "session.update",
                "session": {
                    "audio": {
                        "input": {
                            "format": {"type": "audio/pcm", "rate": 16000},
                            "turn_detection": {"type": "semantic_vad"},
                        }
                    }
                },
            }
        ),
        json.dumps(
            {"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"threshold": 2}}}}}
        ),
    ]
    with _raw(server) as ws:
        created = json.loads(ws.recv(timeout=30))
        assert created["type"] == "session.created"
        for message in bad:
            ws.send(message)
            event = json.loads(ws.recv(timeout=30))
            assert event["type"] == "error" and event["error"]["message"], (message, event)
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        unchanged = json.loads(ws.recv(timeout=30))
        assert unchanged["type"] == "session.updated" and unchanged["session"] == {
            **created["session"],
            "id": unchanged["session"]["id"],
        }
        ws.send(
            json.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}})
        )
        assert json.loads(ws.recv(timeout=30))["type"] == "session.updated"
        ws.send(
            json.dumps(
                {
                    "type": "input_audio_buffer.append",
                    "audio": base64.b64encode(_pcm16(spoken[4], SESSION_RATE)).decode(),
                }
            )
        )
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        while (event := json.loads(ws.recv(timeout=60)))[
            "type"
        ] != "conversation.item.input_audio_transcription.completed":
            assert event["type"] != "error", event
        # as the HTTP endpoint hears the same clip (tiny.en mishears its last word: so do both)
        http = client.audio.transcriptions.create(model="whisper", file=("s.wav", spoken[4])).text
        assert _words(event["transcript"]) == _words(http)
    deadline = time.monotonic() + 10
    while metric(server.url, "omni_running_requests") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(server.url, "omni_running_requests") == 0  # the session's slot is back


def test_the_handshake_refuses_a_missing_key_and_an_unknown_model(server):
    with pytest.raises(InvalidStatus) as refused:
        _raw(server, Authorization="")
    assert refused.value.response.status_code == 401
    url = server.url.replace("http://", "ws://") + "/v1/realtime?model=gpt-realtime"
    with pytest.raises(InvalidStatus) as unknown:
        connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=30)
    assert unknown.value.response.status_code == 404
    assert json.loads(unknown.value.response.body)["error"]["code"] == "model_not_found"
