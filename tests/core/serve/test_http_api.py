"""The HTTP API of a real `omni serve` subprocess, driven by the official `openai` client (and raw
httpx where the client hides what is checked). The server must stay healthy after every test."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from openai import OpenAI

from tests.core.serve.server import API_KEY, metric, tone_wav

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
TEXT = "The quick brown fox jumps over the lazy dog."
RATE = 16000


@pytest.fixture
def server(api_server):
    return api_server


@pytest.fixture
def client(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


def pcm(client, text=TEXT, voice="alloy", **extra) -> np.ndarray:
    data = client.audio.speech.create(
        model="testfamily", input=text, voice=voice, response_format="pcm", extra_body=extra
    ).content
    return np.frombuffer(data, dtype="<i2")


def test_speech_in_every_format(client, server):
    reference = pcm(client)
    assert len(reference) == len(TEXT.encode()) * 400  # the fixture makes 25 ms per input byte
    for fmt, content_type in [
        ("wav", "audio/wav"),
        ("flac", "audio/flac"),
        ("mp3", "audio/mpeg"),
        ("opus", "audio/ogg"),
    ]:
        raw = client.audio.speech.with_raw_response.create(
            model="testfamily", input=TEXT, voice="alloy", response_format=fmt
        )
        assert raw.headers["content-type"] == content_type
        assert raw.headers["x-sample-rate"] == str(RATE)
        audio, rate = sf.read(io.BytesIO(raw.content), dtype="int16")
        assert rate == RATE
        if fmt in ("wav", "flac"):  # lossless: the same samples as pcm
            np.testing.assert_array_equal(audio, reference)
        else:
            assert abs(len(audio) - len(reference)) < 0.1 * len(reference)
    assert metric(server.url, "omni_time_to_first_audio_seconds_count", endpoint="/v1/audio/speech") >= 1


def test_streamed_speech_equals_whole(client, server):
    whole = pcm(client, voice="echo")
    streams_before = metric(server.url, "omni_stream_least_buffer_seconds_count", endpoint="/v1/audio/speech")
    with client.audio.speech.with_streaming_response.create(
        model="testfamily", input=TEXT, voice="echo", response_format="pcm", stream_format="audio"
    ) as response:
        assert response.headers["content-type"] == "audio/pcm"
        assert response.headers["x-sample-rate"] == str(RATE)
        chunks = [chunk for chunk in response.iter_bytes(chunk_size=None) if chunk]
    assert len(chunks) > 1  # produced and sent chunk by chunk
    np.testing.assert_array_equal(np.frombuffer(b"".join(chunks), dtype="<i2"), whole)
    # the stream's playback margin, as a real-time listener of what was sent would have it
    assert metric(server.url, "omni_stream_least_buffer_seconds_count", endpoint="/v1/audio/speech") == streams_before + 1
    assert 'omni_stream_underrun_seconds_total{endpoint="/v1/audio/speech"}' in httpx.get(f"{server.url}/metrics", timeout=5).text


def test_speech_sse_deltas_then_done(client, server):
    whole = pcm(client)
    body = {
        "model": "testfamily",
        "input": TEXT,
        "voice": "alloy",
        "response_format": "pcm",
        "stream_format": "sse",
    }
    events = []
    with httpx.stream("POST", f"{server.url}/v1/audio/speech", json=body, headers=HEADERS, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) > 1 and events[-1]["type"] == "speech.audio.done"
    audio = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    np.testing.assert_array_equal(np.frombuffer(audio, dtype="<i2"), whole)
    usage = events[-1]["usage"]
    assert usage["input_tokens"] == len(TEXT.encode())
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_cloning_from_reference_audio(client):
    reference = base64.b64encode(tone_wav(1.5)).decode()
    cloned = pcm(
        client, voice=None, reference_audio=f"data:audio/wav;base64,{reference}", reference_text="a tone"
    )
    plain_b64 = pcm(client, voice=None, reference_audio=reference)
    assert len(cloned) == len(TEXT.encode()) * 400
    np.testing.assert_array_equal(cloned, plain_b64)  # data URL and bare base64 are the same clip
    assert not np.array_equal(cloned, pcm(client, voice="alloy"))  # the reference shaped the voice


def test_transcriptions_any_format_and_rate(client):
    results = {}
    for name, rate, fmt in [
        ("a.wav", 16000, "WAV"),
        ("a.flac", 44100, "FLAC"),
        ("a.ogg", 22050, "OGG"),
        ("a.mp3", 24000, "MP3"),
    ]:
        upload = tone_wav(3.0, rate=rate, fmt=fmt)
        verbose = client.audio.transcriptions.create(
            model="testfamily",
            file=(name, upload),
            response_format="verbose_json",
            timestamp_granularities=["segment"],
        )
        assert verbose.duration == pytest.approx(3.0, abs=0.05)  # resampled to the family's 16 kHz
        assert verbose.language == "en"  # a family that gives no language_name: its code
        assert len(verbose.segments) == 3 and verbose.text == " ".join(s.text for s in verbose.segments)
        results[name] = verbose.text
    upload = tone_wav(3.0)
    assert (
        client.audio.transcriptions.create(model="testfamily", file=("a.wav", upload)).text
        == results["a.wav"]
    )
    text = client.audio.transcriptions.create(
        model="testfamily", file=("a.wav", upload), response_format="text"
    )
    assert text.strip() == results["a.wav"]
    srt = client.audio.transcriptions.create(
        model="testfamily", file=("a.wav", upload), response_format="srt"
    )
    assert srt.startswith("1\n00:00:00,000 --> 00:00:01,000\n")
    vtt = client.audio.transcriptions.create(
        model="testfamily", file=("a.wav", upload), response_format="vtt"
    )
    assert vtt.startswith("WEBVTT\n") and "00:00:02.000 --> 00:00:03.000" in vtt


def test_translation_of_a_family_without_it_is_a_clear_400(client):
    with pytest.raises(openai.BadRequestError, match="does not do translation") as caught:
        client.audio.translations.create(model="testfamily", file=("a.wav", tone_wav(1.0)))
    assert caught.value.body["code"] == "unsupported_task"
    assert client.audio.transcriptions.create(model="testfamily", file=("a.wav", tone_wav(1.0))).text  # served on


def test_transcription_stream(client):
    stream = client.audio.transcriptions.create(
        model="testfamily", file=("a.wav", tone_wav(3.0)), stream=True
    )
    events = list(stream)
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert len(deltas) == 3 and events[-1].type == "transcript.text.done"
    assert "".join(deltas) == events[-1].text


def test_chat_text_audio_and_audio_input(client):
    audio_in = base64.b64encode(tone_wav(2.0)).decode()
    reply = client.chat.completions.create(
        model="testfamily",
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "wav"},
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what did you hear"},
                    {"type": "input_audio", "input_audio": {"data": audio_in, "format": "wav"}},
                ],
            }
        ],
    )
    message = reply.choices[0].message
    assert "4 words, 2.0 seconds of audio" in message.audio.transcript
    audio, rate = sf.read(io.BytesIO(base64.b64decode(message.audio.data)))
    assert rate == RATE and len(audio) == len(message.audio.transcript.encode()) * 400
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens > 0
    image = "data:image/png;base64," + base64.b64encode(b"\x89PNG not really").decode()
    text_only = client.chat.completions.create(
        model="testfamily",
        messages=[
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hi"},
                    {"type": "image_url", "image_url": {"url": image}},
                ],
            },
        ],
    )
    assert text_only.choices[0].message.content.startswith(
        "You sent 1 words, 0.0 seconds of audio and 1 images"
    )
    assert text_only.choices[0].message.audio is None


def test_chat_stream_text_and_audio_deltas(server):
    body = {
        "model": "testfamily",
        "stream": True,
        "modalities": ["text", "audio"],
        "audio": {"voice": "echo", "format": "pcm16"},
        "messages": [{"role": "user", "content": "hello there"}],
    }
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json=body, headers=HEADERS, timeout=60
    ) as r:
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    transcript = "".join(d["audio"].get("transcript", "") for d in deltas if "audio" in d)
    audio = b"".join(
        base64.b64decode(d["audio"]["data"]) for d in deltas if "audio" in d and "data" in d["audio"]
    )
    assert transcript.startswith("You sent 2 words")
    assert len(audio) == len(transcript.encode()) * 400 * 2  # pcm16
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


def test_voices_save_use_delete(client, server):
    url = f"{server.url}/v1/audio/voices"
    created = httpx.post(
        url,
        headers=HEADERS,
        data={"name": "narrator", "text": "a tone"},
        files={"file": ("ref.wav", tone_wav(1.0), "audio/wav")},
        timeout=30,
    )
    assert created.status_code == 200, created.text
    voice = created.json()
    listed = httpx.get(url, headers=HEADERS, timeout=10).json()["data"]
    assert {"alloy", "echo", voice["id"]} <= {v["id"] for v in listed}
    by_name, by_id = pcm(client, voice="narrator"), pcm(client, voice=voice["id"])
    np.testing.assert_array_equal(by_name, by_id)
    assert not np.array_equal(by_name, pcm(client, voice="alloy"))
    duplicate = httpx.post(
        url,
        headers=HEADERS,
        data={"name": "narrator", "text": "x"},
        files={"file": ("ref.wav", tone_wav(1.0), "audio/wav")},
        timeout=30,
    )
    assert duplicate.status_code == 400
    saved = sorted(p.name for p in (server.log_path.parent / "voices").iterdir() if p.name != ".lock")  # the store's lock
    assert saved == [f"{voice['id']}.json", f"{voice['id']}.wav"]  # no temporary files left behind
    assert httpx.delete(f"{url}/{voice['id']}", headers=HEADERS, timeout=10).status_code == 200
    assert httpx.delete(f"{url}/{voice['id']}", headers=HEADERS, timeout=10).status_code == 404
    body = {"model": "testfamily", "input": "hi", "voice": "narrator"}
    assert (
        httpx.post(f"{server.url}/v1/audio/speech", json=body, headers=HEADERS, timeout=10).status_code == 400
    )


@pytest.mark.parametrize(
    ("seconds", "rate", "why"),
    [(12.0, 16000, "lasts 12.00 s"), (0.2, 16000, "lasts 0.20 s"), (2.0, 4000, "sampled at 4000 Hz")],
)
def test_a_voice_the_family_cannot_clone_from_is_not_saved(server, seconds, rate, why):
    url = f"{server.url}/v1/audio/voices"
    before = httpx.get(url, headers=HEADERS, timeout=10).json()["data"]
    refused = httpx.post(
        url,
        headers=HEADERS,
        data={"name": "unusable", "text": "a tone"},
        files={"file": ("ref.wav", tone_wav(seconds, rate=rate), "audio/wav")},
        timeout=30,
    )
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "file" and error["code"] == "unusable_reference"
    assert "must last 0.5-10 s at 8000-48000 Hz" in error["message"] and why in error["message"]
    assert httpx.get(url, headers=HEADERS, timeout=10).json()["data"] == before


def test_models_and_metrics(client, server):
    assert [m.id for m in client.models.list().data] == ["testfamily"]
    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    for name in (
        "omni_requests_total",
        "omni_request_duration_seconds",
        "omni_time_to_first_audio_seconds",
        "omni_real_time_factor",
        "omni_queue_depth",
        "omni_running_requests",
        "omni_stage_requests",
    ):
        assert name in text
