"""The parts of /v1/realtime speech and conversation sessions that need no server: which kind of
session a family's tasks open, `session.update` on a realtime session (all or nothing, OpenAI's
field shapes), conversation items read into chat parts, and pcm16 out at the session's rate."""

from __future__ import annotations

import base64
from types import SimpleNamespace

import numpy as np
import pytest
from omni_core.serve.errors import APIError
from omni_core.serve.realtime.conversation_items import read_item
from omni_core.serve.realtime.endpoint import session_kind
from omni_core.serve.realtime.realtime_config import CONVERSATION, SPEECH, RealtimeConfig, updated
from omni_core.serve.realtime.responses import OutputAudio
from omni_core.serve.realtime.turns import ServerVad

LIMITS = SimpleNamespace(max_audio_seconds=5.0)
PCM_8K = {"type": "audio/pcm", "rate": 8000}


@pytest.mark.parametrize(
    "tasks, intent, kind",
    [
        (("chat", "speech"), None, "conversation"),
        (("speech",), None, "speech"),
        (("transcription", "translation"), None, "transcription"),
        (("transcription", "chat"), "transcription", "transcription"),
        (("speech",), "transcription", None),
        ((), None, None),
    ],
)
def test_the_family_tasks_pick_the_session(tasks, intent, kind):
    assert session_kind(tasks, intent) == kind


def test_session_update_reads_openai_shapes():
    config = RealtimeConfig(model="m", mode=CONVERSATION, turn_detection=ServerVad())
    new = updated(
        config,
        {
            "type": "realtime",
            "instructions": "Be brief.",
            "output_modalities": ["text"],
            "max_output_tokens": "inf",
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": 16000},
                    "turn_detection": {"type": "server_vad", "create_response": False},
                },
                "output": {"voice": {"id": "my-voice"}, "speed": 1.5, "format": PCM_8K},
            },
        },
    )
    assert (new.rate, new.output_rate, new.voice, new.speed) == (16000, 8000, "my-voice", 1.5)
    assert new.instructions == "Be brief." and new.output_modalities == ["text"]
    assert new.max_output_tokens is None
    assert new.turn_detection.create_response is False and new.turn_detection.interrupt_response is True
    described = new.describe("sess_1")
    assert described["audio"]["output"] == {"format": PCM_8K, "voice": "my-voice", "speed": 1.5}
    assert described["audio"]["input"]["turn_detection"]["create_response"] is False
    assert config.voice is None and config.rate == 24000  # the old settings are untouched


@pytest.mark.parametrize(
    "mode, session, param",
    [
        (SPEECH, {"type": "transcription"}, "session.type"),
        (SPEECH, {"output_modalities": ["text"]}, "session.output_modalities"),
        (SPEECH, {"audio": {"input": {"turn_detection": {}}}}, "session.audio.input.turn_detection"),
        (CONVERSATION, {"output_modalities": ["text", "audio"]}, "session.output_modalities"),
        (CONVERSATION, {"max_output_tokens": 0}, "session.max_output_tokens"),
        (CONVERSATION, {"audio": {"output": {"voice": 5}}}, "session.audio.output.voice"),
        (CONVERSATION, {"audio": {"output": {"speed": 9}}}, "session.audio.output.speed"),
        (CONVERSATION, {"audio": {"input": {"transcription": {}}}}, "session.audio.input.transcription"),
        (CONVERSATION, {"instructions": 3, "audio": {"output": {"voice": "v"}}}, "session.instructions"),
    ],
)
def test_a_bad_field_is_refused_by_name(mode, session, param):
    with pytest.raises(APIError) as refused:
        updated(RealtimeConfig(model="m", mode=mode), session)
    assert refused.value.status == 400 and refused.value.param == param


def _pcm16(samples: np.ndarray) -> str:
    return base64.b64encode((samples * 32767).astype("<i2").tobytes()).decode()


def test_items_become_chat_parts():
    tone = np.sin(np.arange(24000) / 10).astype(np.float32) * 0.5
    item = read_item(
        {
            "type": "message",
            "role": "user",
            "id": "item_a",
            "content": [
                {"type": "input_text", "text": "Hi. "},
                {"type": "input_audio", "audio": _pcm16(tone)},
            ],
        },
        "item",
        24000,
        LIMITS,
    )
    assert item.id == "item_a" and item.text == "Hi. "
    assert item.parts[1]["sample_rate"] == 16000 and item.audio_seconds == pytest.approx(1.0, abs=0.01)
    assert item.describe()["content"] == [
        {"type": "input_text", "text": "Hi. "},
        {"type": "input_audio", "transcript": None},
    ]
    reply = read_item(
        {"role": "assistant", "content": [{"type": "output_audio", "transcript": "Hello."}]},
        "item",
        24000,
        LIMITS,
    )
    assert reply.message() == {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]}


@pytest.mark.parametrize(
    "item, param",
    [
        ({"type": "function_call"}, "item.type"),
        ({"role": "tool", "content": [{"type": "input_text", "text": "x"}]}, "item.role"),
        ({"role": "user", "content": []}, "item.content"),
        ({"role": "system", "content": [{"type": "input_audio", "audio": ""}]}, "item.content[0].type"),
        ({"role": "user", "content": [{"type": "input_audio", "audio": ""}]}, "item.content[0].audio"),
        ({"role": "user", "content": [{"type": "input_audio", "audio": _pcm16(np.zeros(24000 * 6))}]},
         "item.content[0].audio"),
        ({"role": "user", "content": [{"type": "input_text", "text": 5}]}, "item.content[0].text"),
    ],
)
def test_bad_items_are_refused_by_name(item, param):
    with pytest.raises(APIError) as refused:
        read_item(item, "item", 24000, LIMITS)
    assert refused.value.status == 400 and refused.value.param == param


def test_output_audio_is_pcm16_at_the_session_rate():
    same = OutputAudio(24000, 24000)
    assert same.feed(np.array([0.0, 0.5, -2.0], np.float32)) == np.array([0, 16383, -32767], "<i2").tobytes()
    assert same.close() == b""
    down = OutputAudio(24000, 16000)
    chunks = [down.feed(np.zeros(2400, np.float32)) for _ in range(10)] + [down.close()]
    assert sum(len(c) for c in chunks) == 16000 * 2  # one second at 16 kHz, every sample sent
