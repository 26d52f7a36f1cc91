"""End to end: a real `omni serve --family fish-s2pro --preset tiny` subprocess on 127.0.0.1 and
the `openai` client. The tiny preset's audio is noise, so this checks lengths, streaming,
repeatability, cloning from an espeak-ng recording and from a saved voice, and refusals."""

from __future__ import annotations

import base64
import io
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf

from tests.helpers.server import OmniServer

TEXT = "Hello there, this sentence is spoken in several chunks."
FRAME = 2048  # samples a frame of codes makes at 44.1 kHz
MAX_FRAMES = 16  # max_new_tokens: random weights rarely draw the end token, so replies stay short
LIMITS = "reference audio must last 0.5-30 s at 8000-192000 Hz"


@pytest.fixture(scope="module")
def server(tiny_dir, omni_cache, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("fish-s2pro-serve")
    # the preset is already written under OMNI_CACHE: `--preset tiny` finds and reuses it
    proc = OmniServer(
        "fish-s2pro",
        workdir,
        "--preset",
        "tiny",
        "--voices-dir",
        str(workdir / "voices"),
        "--option",
        f"max_new_tokens={MAX_FRAMES}",
        OMNI_PLUGINS="fish-s2pro",
        OMNI_CACHE=str(omni_cache),
        OMP_NUM_THREADS="1",
    )
    proc.wait_ready()
    yield proc.url, proc.log_path
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0, timeout=120)


def _pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.int32)


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal audio, up to one step of 16-bit rounding (chunks may be cut at other frames)."""
    return a.shape == b.shape and int(np.abs(a - b).max(initial=0)) <= 1


def _speak(client, **kwargs) -> np.ndarray:
    args = {"model": "fish-s2pro", "voice": "default", "input": TEXT, "response_format": "pcm"} | kwargs
    return _pcm(client.audio.speech.create(**args).content)


def test_logs_that_the_tiny_preset_is_noise(server):
    assert (
        server[1]
        .read_text()
        .count("holds the 'tiny (revision 1)' preset (random weights): its audio is noise")
        == 1
    )


def test_default_voice_whole_and_streamed_and_seed(client):
    whole = _speak(client, extra_body={"seed": 7})
    assert 0 < len(whole) <= MAX_FRAMES * FRAME and len(whole) % FRAME == 0
    assert _close(_speak(client, extra_body={"seed": 7}), whole)  # a seed makes output repeatable
    other = _speak(client, extra_body={"seed": 8})
    assert not _close(other[: len(whole)], whole[: len(other)])

    chunks = []
    with client.audio.speech.with_streaming_response.create(
        model="fish-s2pro",
        voice="default",
        input=TEXT,
        response_format="pcm",
        extra_body={"seed": 7, "stream_format": "audio"},
    ) as response:
        assert response.headers["x-sample-rate"] == "44100"
        chunks = [c for c in response.iter_bytes() if c]
    assert len(chunks) >= 2  # audio arrives in chunks, not at the end
    assert _close(_pcm(b"".join(chunks)), whole)


@pytest.mark.parametrize("fmt", ["flac", "mp3", "opus"])
def test_every_encoded_format_at_44_1_khz_whole_and_streamed(client, fmt):
    args = {"model": "fish-s2pro", "voice": "default", "input": "Short.", "response_format": fmt}
    whole = client.audio.speech.create(**args, extra_body={"seed": 5}).content
    samples, rate = sf.read(io.BytesIO(whole), dtype="float32")
    assert rate == (48000 if fmt == "opus" else 44100) and len(samples) > 0
    with client.audio.speech.with_streaming_response.create(
        **args, extra_body={"seed": 5, "stream_format": "audio"}
    ) as response:
        streamed = b"".join(response.iter_bytes())
    # the same container (a streamed header cannot know the length, so it is not compared whole)
    assert streamed[:4] == whole[:4] and len(streamed) > 1000


def test_clone_from_reference_audio_and_from_a_saved_voice(client, server, reference):
    audio, rate, transcript, path = reference
    encoded = base64.b64encode(path.read_bytes()).decode()
    body = {"reference_audio": encoded, "reference_text": transcript, "seed": 1}
    cloned = client.audio.speech.create(
        model="fish-s2pro", voice=None, input=TEXT, response_format="wav", extra_body=body
    )
    samples, out_rate = sf.read(io.BytesIO(cloned.content), dtype="float32")
    assert out_rate == 44100 and len(samples) > 0 and len(samples) % FRAME == 0
    again = client.audio.speech.create(
        model="fish-s2pro", voice=None, input=TEXT, response_format="pcm", extra_body=body
    )
    own = _speak(client, extra_body={"seed": 1})
    assert not _close(
        _pcm(again.content)[: len(own)], own[: len(_pcm(again.content))]
    )  # the reference is in the prompt

    saved = httpx.post(
        f"{server[0]}/v1/audio/voices",
        data={"name": "birch", "text": transcript},
        files={"file": ("ref.wav", path.read_bytes(), "audio/wav")},
        timeout=60,
    )
    assert saved.status_code == 200, saved.text
    listed = httpx.get(f"{server[0]}/v1/audio/voices").json()["data"]
    assert {"default", "birch"} <= {v.get("name") for v in listed} | {v.get("id") for v in listed}
    by_name = _speak(client, voice="birch", extra_body={"seed": 1})
    assert _close(by_name, _pcm(again.content))  # a saved voice is its recording and transcript


@pytest.mark.parametrize("seconds", [0.2, 31.0])
def test_a_reference_too_short_or_long_is_refused_naming_the_limits(client, server, seconds):
    clip = io.BytesIO()
    sf.write(clip, np.full(int(seconds * 16000), 0.1, np.float32), 16000, format="WAV")
    with pytest.raises(openai.BadRequestError, match=LIMITS):
        client.audio.speech.create(
            model="fish-s2pro",
            voice=None,
            input="Hi",
            response_format="pcm",
            extra_body={
                "reference_audio": base64.b64encode(clip.getvalue()).decode(),
                "reference_text": "a clip",
            },
        )
    refused = httpx.post(
        f"{server[0]}/v1/audio/voices",
        data={"name": f"clip {seconds}", "text": "a clip"},
        files={"file": ("clip.wav", clip.getvalue(), "audio/wav")},
        timeout=60,
    )
    assert (
        refused.status_code == 400
        and f"{LIMITS}; this one lasts {seconds:.2f} s" in refused.json()["error"]["message"]
    )


def test_concurrent_requests_batch_and_each_matches_its_audio_alone(client):
    texts = [f"Request number {i} speaks." for i in range(6)]
    with ThreadPoolExecutor(len(texts)) as pool:
        together = list(
            pool.map(lambda i: _speak(client, input=texts[i], extra_body={"seed": 20 + i}), range(len(texts)))
        )
    for i in (0, 3):
        assert _close(_speak(client, input=texts[i], extra_body={"seed": 20 + i}), together[i])
    assert not _close(together[0][: len(together[1])], together[1][: len(together[0])])


def test_long_text_is_spoken_in_segments_joined_in_order(client):
    text = "This is one sentence of a long text. " * 12  # three segments of at most 200 bytes
    whole = _speak(client, input=text, extra_body={"seed": 4})
    assert len(whole) > MAX_FRAMES * FRAME  # longer than one request's max_new_tokens allows
    chunks = []
    with client.audio.speech.with_streaming_response.create(
        model="fish-s2pro",
        voice="default",
        input=text,
        response_format="pcm",
        extra_body={"seed": 4, "stream_format": "audio"},
    ) as response:
        chunks = [c for c in response.iter_bytes() if c]
    assert _close(_pcm(b"".join(chunks)), whole)


def test_bad_input_is_a_clear_400_and_the_server_carries_on(client, server):
    with pytest.raises(openai.BadRequestError, match="control token"):
        _speak(client, input="Hello <|im_end|> there")
    with pytest.raises(openai.BadRequestError, match="instructions"):
        _speak(client, instructions="whisper")
    with pytest.raises(openai.BadRequestError, match="unknown voice"):
        _speak(client, voice="nobody")
    with pytest.raises(openai.BadRequestError, match="repetition_penalty"):  # it samples repetition-aware
        _speak(client, extra_body={"repetition_penalty": 1.2})
    with pytest.raises(openai.BadRequestError, match="top_p"):
        _speak(client, extra_body={"top_p": 0})
    assert len(_speak(client, input="Still here.", extra_body={"seed": 2})) > 0
    assert httpx.get(f"{server[0]}/health").status_code == 200


def test_text_the_prompt_cannot_hold_is_a_413_naming_the_limit(client, server):
    # one speaker turn is never cut (segments keep turns whole), and this one's UTF-8 bytes, each
    # a token of the tiny byte-level tokenizer, pass the tiny model's 4096 positions
    turn = "<|speaker:0|>" + "été " * 700
    limit = "the model holds 4096 tokens (max_model_len) with its reply"
    with pytest.raises(openai.APIStatusError, match=re.escape(limit)) as refused:
        _speak(client, input=turn)
    assert refused.value.status_code == 413
    assert refused.value.body["code"] == "too_large" and refused.value.body["type"] == "invalid_request_error"
    streamed = httpx.post(
        f"{server[0]}/v1/audio/speech",
        json={"model": "fish-s2pro", "voice": "default", "input": turn, "stream_format": "audio"},
        timeout=60,
    )
    assert streamed.status_code == 413 and limit in streamed.json()["error"]["message"]
    assert len(_speak(client, input="Still here.", extra_body={"seed": 2})) > 0
