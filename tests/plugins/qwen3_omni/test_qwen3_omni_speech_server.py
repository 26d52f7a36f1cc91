"""Speech out end to end: `omni serve --family qwen3-omni --preset tiny` answers the official
`openai` client's chats with `modalities: ["text", "audio"]` (whole replies with `message.audio`,
streamed ones with `delta.audio` chunks), `/v1/audio/speech`, and lists the checkpoint's speakers;
bad voices and formats are 400s; a client that leaves mid-stream leaves no KV block held in
either AR stage; a thinker-only deployment refuses audio naming its option; and every stage in
its own process speaks as in one process."""

from __future__ import annotations

import base64
import io
import re
import time

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf

from .conftest import openai_client, tiny_server

SPEECH = ("talker_temperature=0", "talker_max_tokens=40", "max_model_len=1024")
HELLO = [{"role": "user", "content": "Good morning! What is new?"}]


@pytest.fixture(scope="module")
def server(omni_cache, tiny_dir, tmp_path_factory):
    with tiny_server(omni_cache, tmp_path_factory.mktemp("qwen3-omni-speech"), *SPEECH) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def decode(data: bytes) -> tuple[np.ndarray, int]:
    samples, rate = sf.read(io.BytesIO(data), dtype="float32")
    return samples, rate


def test_whole_reply_carries_audio_and_its_transcript(client):
    reply = client.chat.completions.create(model="qwen3-omni", messages=HELLO, modalities=["text", "audio"],
                                           audio={"voice": "chelsie", "format": "wav"}, max_tokens=10, temperature=0)
    message = reply.choices[0].message
    assert message.content is None and message.audio is not None  # as OpenAI: the words are the audio's transcript
    samples, rate = decode(base64.b64decode(message.audio.data))
    assert rate == 24000 and samples.size >= 4 * 1920  # several 80 ms frames
    assert message.audio.id.startswith("audio_") and message.audio.expires_at > time.time()
    text = client.chat.completions.create(model="qwen3-omni", messages=HELLO, max_tokens=10, temperature=0).choices[0].message.content
    assert message.audio.transcript == text
    other = client.chat.completions.create(model="qwen3-omni", messages=HELLO, modalities=["text", "audio"],
                                           audio={"voice": "aiden", "format": "flac"}, max_tokens=10, temperature=0).choices[0].message
    assert other.audio.transcript == text and decode(base64.b64decode(other.audio.data))[1] == 24000


def test_streamed_reply_interleaves_text_and_audio_deltas(client):
    stream = client.chat.completions.create(model="qwen3-omni", messages=HELLO, modalities=["text", "audio"],
                                            audio={"voice": "ethan", "format": "pcm16"}, max_tokens=10, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    pcm, transcript, order, usage = b"", "", [], None
    for chunk in stream:
        usage = chunk.usage or usage
        if not chunk.choices:
            continue
        audio = getattr(chunk.choices[0].delta, "audio", None)
        if audio:  # the client keeps the fields it does not model as extra attributes
            if getattr(audio, "data", None):
                pcm += base64.b64decode(audio.data)
                order.append("audio")
            if getattr(audio, "transcript", None):
                transcript += audio.transcript
                order.append("text")
    assert "audio" in order and "text" in order
    assert len(pcm) % 2 == 0 and len(pcm) // 2 >= 4 * 1920
    whole = client.chat.completions.create(model="qwen3-omni", messages=HELLO, modalities=["text", "audio"],
                                           audio={"voice": "ethan", "format": "wav"}, max_tokens=10, temperature=0).choices[0].message
    samples, _ = decode(base64.b64decode(whole.audio.data))
    streamed = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768
    assert transcript == whole.audio.transcript
    # the same speech: the stream's chunks joined are the whole reply's samples (16-bit rounding)
    assert streamed.shape == samples.shape and np.abs(streamed - samples).max() <= 2 / 32768
    assert usage is not None and usage.completion_tokens >= 1


def test_speech_endpoint_and_voices(server, client):
    voices = httpx.get(f"{server.url}/v1/audio/voices", timeout=10).json()["data"]
    assert {v["id"] for v in voices} == {"chelsie", "ethan", "aiden"}
    # seeded: unseeded, the random tiny thinker now and then ends its reply at once (no speech)
    audio = client.audio.speech.create(model="qwen3-omni", voice="ethan", input="Read this aloud.", response_format="wav",
                                       extra_body={"seed": 3})
    samples, rate = decode(audio.content)
    assert rate == 24000 and samples.size > 0


@pytest.mark.parametrize(
    "audio, message",
    [
        ({"voice": "nobody", "format": "wav"}, r"unknown voice 'nobody'; available: aiden, chelsie, ethan"),
        ({"voice": "ethan", "format": "aiff"}, r"format"),
    ],
)
def test_bad_voice_and_format_are_400s(client, audio, message):
    with pytest.raises(openai.BadRequestError, match=message):
        client.chat.completions.create(model="qwen3-omni", messages=HELLO, modalities=["text", "audio"], audio=audio, max_tokens=4)


def test_client_leaving_mid_stream_frees_both_engines(server, client):
    for _ in range(3):
        stream = client.chat.completions.create(model="qwen3-omni", messages=HELLO, modalities=["text", "audio"],
                                                audio={"voice": "ethan", "format": "pcm16"}, max_tokens=200, stream=True)
        for chunk in stream:
            if chunk.choices and getattr(chunk.choices[0].delta, "audio", None):
                break
        stream.close()
    deadline = time.time() + 10
    while True:
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
        usage = {s: float(v) for s, v in re.findall(r'omni_kv_cache_usage\{stage="(\w+)"\} ([0-9.e+-]+)', metrics)}
        if usage.get("thinker") == 0.0 and usage.get("talker") == 0.0 or time.time() > deadline:
            break
        time.sleep(0.2)
    assert usage == {"thinker": 0.0, "talker": 0.0}
    reply = client.chat.completions.create(model="qwen3-omni", messages=HELLO, modalities=["text", "audio"], audio={"format": "wav"}, max_tokens=4)
    assert reply.choices[0].message.audio.data


def test_thinker_only_deployment_refuses_audio(omni_cache, tmp_path):
    with tiny_server(omni_cache, tmp_path, "audio_output=false") as proc:
        client = openai_client(proc)
        with pytest.raises(openai.BadRequestError, match="--option audio_output"):
            client.chat.completions.create(model="qwen3-omni", messages=HELLO, modalities=["text", "audio"], audio={"format": "wav"}, max_tokens=4)
        assert client.chat.completions.create(model="qwen3-omni", messages=HELLO, max_tokens=4).choices[0].message.content is not None
        metrics = httpx.get(f"{proc.url}/metrics", timeout=10).text
        assert 'stage="thinker"' in metrics and 'stage="talker"' not in metrics  # no talker built


def test_each_stage_in_its_own_process_speaks_as_in_one(tiny_dir):
    """The thinker's stream (ids, and its states at media rows) and the talker's frames cross
    process boundaries; greedy speech is the in-process one."""
    from omni_core import Omni

    from .conftest import noise

    messages = [{"role": "user", "content": [{"type": "audio", "audio": noise(1.5).numpy(), "sample_rate": 16000},
                                             {"type": "text", "text": "Say it back"}]}]
    replies = []
    for mode in ("inproc", "process"):
        with Omni(family="qwen3-omni", checkpoint_dir=tiny_dir, stage_mode=mode, options={"talker_temperature": 0, "talker_max_tokens": 24}) as omni:
            replies.append(omni.chat(messages, modalities=["text", "audio"], sampling={"temperature": 0, "max_tokens": 8}))
    assert replies[0].text == replies[1].text
    assert replies[0].audio is not None and replies[0].audio.size > 0
    np.testing.assert_allclose(replies[1].audio, replies[0].audio, atol=1e-6)
