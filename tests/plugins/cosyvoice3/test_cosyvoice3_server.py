"""End to end: a real `omni serve --family cosyvoice3 --preset tiny` subprocess and the `openai`
client. The tiny preset's audio is noise, so this checks lengths, streaming, repeatability,
cloning from an espeak-ng recording, saved voices, batching and errors — not how it sounds."""

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
from omni_cosyvoice3.segments import split_speech

from tests.helpers.server import OmniServer

TEXT = "Hello there, this sentence is long enough to stream in several chunks."


@pytest.fixture(scope="module")
def server(tiny_dir, omni_cache, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("cosyvoice3-serve")
    # the preset is already written under OMNI_CACHE: `--preset tiny` finds and reuses it
    proc = OmniServer(
        "cosyvoice3",
        workdir,
        "--preset",
        "tiny",
        "--max-running",
        "16",
        "--voices-dir",
        str(workdir / "voices"),
        # random weights draw stop ids at random: every stop id waits for the minimum length, so
        # replies are long enough to stream in several chunks
        "--option",
        "min_length_blocks=all",
        OMNI_PLUGINS="cosyvoice3",
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
    return np.frombuffer(data, dtype="<i2")


def test_logs_that_the_tiny_preset_is_noise(server):
    # once, though the server builds the topology twice (to check it, then to serve it)
    assert server[1].read_text().count("holds the 'tiny (revision 2)' preset (random weights): its audio is noise") == 1


def test_builtin_voice_non_streaming_streaming_and_seed(client):
    whole = client.audio.speech.create(
        model="cosyvoice3", voice="default", input=TEXT, response_format="pcm", extra_body={"seed": 7}
    )
    audio = _pcm(whole.content)
    assert len(audio) > 0 and len(audio) % 480 == 0  # whole 50 Hz mel frames at 24 kHz
    again = client.audio.speech.create(
        model="cosyvoice3", voice="default", input=TEXT, response_format="pcm", extra_body={"seed": 7}
    )
    assert again.content == whole.content  # a seed makes output repeatable
    other = client.audio.speech.create(
        model="cosyvoice3", voice="default", input=TEXT, response_format="pcm", extra_body={"seed": 8}
    )
    assert other.content != whole.content

    chunks = []
    with client.audio.speech.with_streaming_response.create(
        model="cosyvoice3",
        voice="default",
        input=TEXT,
        response_format="pcm",
        extra_body={"seed": 7, "stream_format": "audio"},
    ) as response:
        for chunk in response.iter_bytes():
            chunks.append(chunk)
    assert len([c for c in chunks if c]) >= 2  # audio left after the first token hop, not at the end
    assert b"".join(chunks) == whole.content  # streamed == non-streamed: the pipeline is causal


def test_speed_changes_duration(client):
    normal = _pcm(
        client.audio.speech.create(
            model="cosyvoice3", voice="default", input=TEXT, response_format="pcm", extra_body={"seed": 3}
        ).content
    )
    fast = _pcm(
        client.audio.speech.create(
            model="cosyvoice3",
            voice="default",
            input=TEXT,
            response_format="pcm",
            speed=2.0,
            extra_body={"seed": 3},
        ).content
    )
    assert abs(len(fast) / len(normal) - 0.5) < 0.05


def test_clone_from_espeak_reference_and_saved_voice(client, server, reference):
    audio, rate, transcript, path = reference
    encoded = base64.b64encode(path.read_bytes()).decode()
    cloned = client.audio.speech.create(
        model="cosyvoice3",
        voice=None,
        input=TEXT,
        response_format="wav",
        extra_body={"reference_audio": encoded, "reference_text": transcript, "seed": 1},
    )
    samples, out_rate = sf.read(io.BytesIO(cloned.content), dtype="float32")
    assert out_rate == 24000 and len(samples) > 0
    builtin = client.audio.speech.create(
        model="cosyvoice3", voice="default", input=TEXT, response_format="wav", extra_body={"seed": 1}
    )
    assert builtin.content != cloned.content  # the reference conditions the flow

    url = server[0]
    saved = httpx.post(
        f"{url}/v1/audio/voices",
        data={"name": "birch", "text": transcript},
        files={"file": ("ref.wav", path.read_bytes(), "audio/wav")},
        timeout=60,
    )
    assert saved.status_code == 200, saved.text
    listed = httpx.get(f"{url}/v1/audio/voices").json()["data"]
    assert {"default", "birch"} <= {v.get("name") for v in listed} | {v.get("id") for v in listed}
    by_name = client.audio.speech.create(
        model="cosyvoice3", voice="birch", input=TEXT, response_format="wav", extra_body={"seed": 1}
    )
    assert len(sf.read(io.BytesIO(by_name.content))[0]) > 0


@pytest.mark.parametrize("seconds", [60.0, 0.1])
def test_a_voice_too_long_or_short_to_clone_from_is_not_saved(server, seconds):
    clip = io.BytesIO()
    sf.write(clip, np.full(int(seconds * 16000), 0.1, np.float32), 16000, format="WAV")
    name = f"clip of {seconds} s"
    refused = httpx.post(
        f"{server[0]}/v1/audio/voices",
        data={"name": name, "text": "a clip"},
        files={"file": ("clip.wav", clip.getvalue(), "audio/wav")},
        timeout=60,
    )
    assert refused.status_code == 400, refused.text
    assert f"reference audio must last 0.2-30 s at 8000-192000 Hz; this one lasts {seconds:.2f} s" in refused.json()["error"]["message"]
    assert name not in {v.get("name") for v in httpx.get(f"{server[0]}/v1/audio/voices").json()["data"]}


def test_concurrent_requests_batch_and_match_alone(client):
    texts = [f"Request number {i} speaks a short line." for i in range(6)]

    def speak(i):
        return client.audio.speech.create(
            model="cosyvoice3",
            voice="default",
            input=texts[i],
            response_format="pcm",
            extra_body={"seed": 100 + i},
        ).content

    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(speak, range(6)))
    alone = _pcm(speak(2)).astype(np.int32)
    batched = _pcm(together[2]).astype(np.int32)
    # batched with others or alone: the same tokens, and audio equal up to float rounding
    assert len(alone) == len(batched) and np.abs(alone - batched).max() <= 16
    assert len(set(together)) == 6


def test_long_text_streams_its_segments_in_turn(client, tiny_dir):
    # as one utterance this asks for more speech than the tiny preset's 4096 positions hold
    text = "Far too many words to fit. " * 30
    parts = split_speech(tiny_dir, {"text": text, "seed": 21})
    assert len(parts) > 2

    def speak(words, seed, **extra):
        return client.audio.speech.create(
            model="cosyvoice3", voice="default", input=words, response_format="pcm", extra_body={"seed": seed}, **extra
        )

    with client.audio.speech.with_streaming_response.create(
        model="cosyvoice3", voice="default", input=text, response_format="pcm", stream_format="audio", extra_body={"seed": 21}
    ) as response:
        streamed = _pcm(b"".join(response.iter_bytes())).astype(np.int32)
    alone = np.concatenate([_pcm(speak(p["text"], p["seed"]).content) for p in parts]).astype(np.int32)
    assert len(streamed) == len(alone) and np.abs(streamed - alone).max() <= 16


def test_bad_input_is_a_clear_400(client, server):
    silence = io.BytesIO()
    sf.write(silence, np.zeros(1200, dtype=np.float32), 24000, format="WAV")
    with pytest.raises(openai.BadRequestError, match="reference audio must last") as short:
        client.audio.speech.create(
            model="cosyvoice3",
            voice=None,
            input="Hi",
            response_format="wav",
            extra_body={"reference_audio": base64.b64encode(silence.getvalue()).decode()},
        )
    # where the family raised it is for the server's log, not the client
    assert "(at " not in str(short.value) and ".py:" not in str(short.value)
    assert re.search(r"refused request .*reference audio must last.* \(at \w+\.py:\d+\)", server[1].read_text())
    with pytest.raises(openai.BadRequestError, match="top_k"):
        client.audio.speech.create(model="cosyvoice3", voice="default", input="Hi", extra_body={"top_k": 0})
    with pytest.raises(openai.BadRequestError, match="unknown voice"):
        client.audio.speech.create(model="cosyvoice3", voice="nobody", input="Hi")
    # the server is still healthy and serves the next request
    ok = client.audio.speech.create(
        model="cosyvoice3",
        voice="default",
        input="Still here.",
        response_format="pcm",
        extra_body={"seed": 1},
    )
    assert len(ok.content) > 0
    stats = httpx.get(f"{server[0]}/health").status_code
    assert stats == 200
