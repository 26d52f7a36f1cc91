"""End to end: a real `omni serve --family qwen3-asr --preset tiny` subprocess and the `openai`
client. The tiny preset's words are random tokens, so this checks formats, segments, streaming
and errors, not recognition."""

from __future__ import annotations

import io
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import soundfile as sf

from tests.helpers.server import OmniServer

from .conftest import noise_audio


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = OmniServer(
        "qwen3-asr",
        tmp_path_factory.mktemp("qwen3-asr-serve"),
        "--preset",
        "tiny",
        "--max-running",
        "16",
        OMNI_PLUGINS="qwen3-asr-mlx",
    )
    proc.wait_ready()
    yield proc.url
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=60)


def _wav(seconds: float, seed: int = 0) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, noise_audio(seconds, seed), 16000, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def test_response_formats(client):
    audio = ("speech.wav", _wav(2.5, seed=1))
    result = client.audio.transcriptions.create(model="qwen3-asr", file=audio, language="en")
    assert isinstance(result.text, str) and result.text
    assert result.usage.output_tokens > 0 and result.usage.input_tokens > 0

    plain = client.audio.transcriptions.create(
        model="qwen3-asr", file=audio, language="en", response_format="text"
    )
    assert plain.strip() == result.text.strip()  # greedy decoding is deterministic

    verbose = client.audio.transcriptions.create(
        model="qwen3-asr",
        file=audio,
        language="en",
        response_format="verbose_json",
        timestamp_granularities=["segment"],
    )
    assert verbose.language == "english" and verbose.duration == pytest.approx(2.5)
    assert [(s.start, s.end) for s in verbose.segments] == [(0.0, 2.5)]
    assert verbose.segments[0].text == verbose.text == result.text

    srt = client.audio.transcriptions.create(
        model="qwen3-asr", file=audio, language="en", response_format="srt"
    )
    assert re.match(r"1\n00:00:00,000 --> 00:00:02,500\n", srt)
    vtt = client.audio.transcriptions.create(
        model="qwen3-asr", file=audio, language="en", response_format="vtt"
    )
    assert vtt.startswith("WEBVTT") and "00:00:00.000 --> 00:00:02.500" in vtt


def test_streaming_deltas_add_up(client):
    stream = client.audio.transcriptions.create(
        model="qwen3-asr",
        file=("s.wav", _wav(3.0, seed=2)),
        language="de",
        prompt="Kontext: Omni",
        stream=True,
    )
    events = list(stream)
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    done = [e for e in events if e.type == "transcript.text.done"]
    assert len(deltas) > 1 and len(done) == 1 and events[-1] is done[0]
    assert "".join(deltas) == done[0].text


def test_concurrent_requests_and_bad_input(client, server):
    with ThreadPoolExecutor(8) as pool:
        texts = list(
            pool.map(
                lambda s: (
                    client.audio.transcriptions.create(
                        model="qwen3-asr", file=("c.wav", _wav(1.0 + s / 4, seed=s))
                    ).text
                ),
                range(8),
            )
        )
    assert all(isinstance(t, str) for t in texts)

    with pytest.raises(openai.BadRequestError) as error:
        client.audio.transcriptions.create(model="qwen3-asr", file=("b.wav", _wav(1.0)), language="klingon")
    assert "unsupported language" in error.value.message
    with pytest.raises(openai.BadRequestError):
        client.audio.transcriptions.create(model="qwen3-asr", file=("b.wav", b"not audio at all"))
    # still serving, and nothing left running
    assert client.audio.transcriptions.create(model="qwen3-asr", file=("ok.wav", _wav(1.0))).text is not None
    assert httpx.get(f"{server}/health", timeout=5).status_code == 200
