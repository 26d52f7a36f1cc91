"""The offline ``Omni`` API in this process, on the test family registered through a real plugin
manager (the same runtime the HTTP server wraps)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from omni_core import Omni
from omni_core.hooks import PluginManager
from omni_core.serve.exceptions import InputTooLarge, InvalidInput
from omni_core.surface.inputs import Limits

from tests.core.serve.server import tone_wav


@pytest.fixture(scope="module")
def omni(testfamily_site, tmp_path_factory):
    sys.path.insert(0, str(testfamily_site))
    try:
        import omni_testfamily.plugin
    finally:
        sys.path.remove(str(testfamily_site))
    manager = PluginManager(selection=set())  # omni-core's built-ins only
    manager.register_object("testfamily", omni_testfamily.plugin)
    cache = tmp_path_factory.mktemp("offline")
    with Omni(
        "testfamily",
        preset="tiny",
        plugin_manager=manager,
        cache_dir=str(cache),
        voices_dir=str(cache / "voices"),
        limits=Limits(max_input_chars=500, max_audio_seconds=10),
    ) as instance:
        yield instance
    with pytest.raises(RuntimeError):  # the context manager stopped the pipeline
        instance.speech("after shutdown", voice="alloy")


def test_speech_whole_and_streamed(omni):
    result = omni.speech("Offline speech, streamed or not.", voice="echo")
    assert result.sample_rate == 16000 and result.audio.dtype == np.float32
    assert len(result.audio) == len(b"Offline speech, streamed or not.") * 400
    assert result.usage["input_tokens"] == len(b"Offline speech, streamed or not.")
    chunks = list(omni.speech("Offline speech, streamed or not.", voice="echo", stream=True))
    assert len(chunks) > 1
    np.testing.assert_array_equal(np.concatenate(chunks), result.audio)


def test_stopping_a_stream_early_frees_the_request(omni):
    stream = omni.speech("A long one. " * 30, voice="alloy", stream=True)
    next(stream)
    stream.close()
    assert omni.pipeline.running() == []


def test_transcribe_path_bytes_and_samples(omni, tmp_path):
    path = tmp_path / "clip.wav"
    path.write_bytes(tone_wav(2.0, rate=22050))
    from_path = omni.transcribe(str(path), timestamps=True)
    from_bytes = omni.transcribe(path.read_bytes())
    assert from_path.text == from_bytes.text and len(from_path.text.split()) == 2
    assert [s["end"] for s in from_path.segments] == [1.0, 2.0] and from_path.duration == pytest.approx(
        2.0, abs=0.01
    )
    assert "".join(omni.transcribe(str(path), stream=True)) == from_path.text


def test_chat_with_audio_reply(omni):
    samples = np.sin(np.arange(16000) / 5).astype(np.float32) * 0.2
    reply = omni.chat(
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "listen"},
                    {"type": "audio", "audio": samples, "sample_rate": 16000},
                ],
            }
        ],
        modalities=["text", "audio"],
        voice="alloy",
    )
    assert reply.text.startswith("You sent 1 words, 1.0 seconds of audio")
    assert reply.sample_rate == 16000 and len(reply.audio) == len(reply.text.encode()) * 400


def test_invalid_input_raises_clear_errors(omni):
    with pytest.raises(InvalidInput, match="unknown voice 'nobody'; available: alloy, echo") as info:
        omni.speech("hi", voice="nobody")
    assert info.value.param == "voice"
    with pytest.raises(InputTooLarge):
        omni.speech("x" * 501, voice="alloy")
    with pytest.raises(InputTooLarge):
        omni.transcribe(np.zeros(16000 * 11, np.float32), 16000)
    with pytest.raises(InvalidInput, match="could not decode"):
        omni.transcribe(b"not audio at all" * 10)
    assert omni.pipeline.running() == []


def test_a_saved_voice_is_one_the_family_can_clone_from(omni):
    with pytest.raises(InvalidInput, match=r"must last 0.5-10 s at 8000-48000 Hz; this one lasts 0.25 s") as info:
        omni.save_voice("blip", np.zeros(4000, np.float32), 16000, "too short")
    assert info.value.param == "audio" and omni.voice_store.find("blip") is None
    voice = omni.save_voice("tone", tone_wav(1.0), text="a tone")
    assert voice.duration == 1.0 and omni.voice_store.find("tone") == voice
    assert len(omni.speech("hi", voice="tone").audio) == len(b"hi") * 400
