"""End to end: `omni serve --family whisper` with no --model serves the bundled tiny.en; the
`openai` client transcribes real (espeak-ng) English speech in every response format."""

from __future__ import annotations

import io
import re
from concurrent.futures import ThreadPoolExecutor

import jiwer
import numpy as np
import openai
import pytest
import soundfile as sf

from tests.helpers.packaging import env_with_path, run_omni
from tests.helpers.server import OmniServer


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = OmniServer(
        "whisper", tmp_path_factory.mktemp("whisper-serve"), "--max-running", "16", OMNI_PLUGINS="whisper"
    )
    proc.wait_ready()
    yield proc.url
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=120)


def _words(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]", " ", text.lower()).split())


def test_word_error_rate_on_spoken_sentences(client, spoken, sentences):
    def transcribe(wav: bytes) -> str:
        return client.audio.transcriptions.create(model="whisper", file=("speech.wav", wav)).text

    with ThreadPoolExecutor(len(spoken)) as pool:  # concurrent: they share decoder steps
        texts = list(pool.map(transcribe, spoken))
    error_rate = jiwer.wer([_words(s) for s in sentences], [_words(t) for t in texts])
    assert len(sentences) >= 10
    assert error_rate <= 0.25, list(zip(sentences, texts, strict=True))


def test_response_formats(client, spoken):
    audio = ("speech.wav", spoken[5])
    result = client.audio.transcriptions.create(model="whisper", file=audio)
    assert _words(result.text) == "we are going to the park this afternoon"
    assert result.usage.seconds == pytest.approx(len(sf.read(io.BytesIO(spoken[5]))[0]) / 22050, abs=0.01)

    plain = client.audio.transcriptions.create(model="whisper", file=audio, response_format="text")
    assert plain.strip() == result.text

    verbose = client.audio.transcriptions.create(
        model="whisper", file=audio, response_format="verbose_json", timestamp_granularities=["segment"]
    )
    assert verbose.language == "english" and verbose.duration == pytest.approx(result.usage.seconds, abs=0.01)
    assert verbose.segments and _words(" ".join(s.text for s in verbose.segments)) == _words(verbose.text)
    first, last = verbose.segments[0], verbose.segments[-1]
    assert 0.0 <= first.start < 1.0 and first.start < first.end <= verbose.duration + 0.01 and last.end > 1.0

    timed = client.audio.transcriptions.create(
        model="whisper", file=audio, response_format="verbose_json", timestamp_granularities=["word", "segment"]
    )
    assert _words(" ".join(w.word for w in timed.words)) == _words(timed.text) and timed.segments
    assert all(a.start <= b.start and a.start <= a.end <= verbose.duration for a, b in zip(timed.words, timed.words[1:], strict=False))

    srt = client.audio.transcriptions.create(model="whisper", file=audio, response_format="srt")
    assert re.match(r"1\n00:00:0\d,\d{3} --> 00:00:0\d,\d{3}\n\S", srt)
    vtt = client.audio.transcriptions.create(model="whisper", file=audio, response_format="vtt")
    assert vtt.startswith("WEBVTT") and "park" in vtt


def test_streaming_sends_deltas(client, spoken):
    stream = client.audio.transcriptions.create(model="whisper", file=("speech.wav", spoken[7]), stream=True)
    deltas, done = [], None
    for event in stream:
        if event.type == "transcript.text.delta":
            deltas.append(event.delta)
        elif event.type == "transcript.text.done":
            done = event.text
    assert len(deltas) >= 3 and "".join(deltas) == done
    assert "boxes" in done


def test_bad_upload_is_a_clear_error_and_the_server_goes_on(client, spoken):
    with pytest.raises(openai.BadRequestError):
        client.audio.transcriptions.create(model="whisper", file=("speech.wav", b"not audio at all"))
    silence = io.BytesIO()
    sf.write(silence, np.zeros(16000, dtype=np.float32), 16000, format="WAV")
    with pytest.raises(openai.BadRequestError, match="English-only"):
        client.audio.transcriptions.create(model="whisper", file=("s.wav", silence.getvalue()), language="de")
    named = client.audio.transcriptions.create(model="whisper", file=("s.wav", silence.getvalue()), language=" English ",
                                               response_format="verbose_json")
    assert named.language == "english"  # a name, any case and spacing, as the code
    with pytest.raises(openai.BadRequestError, match="with this checkpoint does not do translation") as refused:
        client.audio.translations.create(model="whisper", file=("s.wav", silence.getvalue()))
    assert refused.value.code == "unsupported_task"
    assert client.models.retrieve("whisper").model_extra["tasks"] == ["transcription"]  # tiny.en: English-only
    assert (
        "coffee" in client.audio.transcriptions.create(model="whisper", file=("speech.wav", spoken[2])).text
    )


@pytest.mark.parametrize("option", ["max_batch=0", "encoder_batch=-1", "batch_window_ms=nan"])
def test_a_batch_option_that_would_stall_the_stages_exits_2_before_loading(option):
    # a decoder batch of 0 rows admitted nothing: every request hung
    result = run_omni(["serve", "--family", "whisper", "--option", option], env_with_path())
    assert result.returncode == 2, result.stderr
    assert f"cannot build the whisper stages: option {option.split('=')[0]}=" in result.stderr
    assert "Traceback" not in result.stderr and "loading" not in result.stderr
