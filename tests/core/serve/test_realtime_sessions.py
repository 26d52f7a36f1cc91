"""The parts of /v1/realtime speech and conversation sessions that need no server: which kind of
session a family's tasks open, `session.update` on a realtime session (all or nothing, OpenAI's
field shapes), conversation items read into chat parts, pcm16 out at the session's rate, and
sessions driven event by event on a server's state with no model (a draining server: each
response fails before it says anything): the text they take and the conversation they keep."""

from __future__ import annotations

import asyncio
import base64
from types import SimpleNamespace

import numpy as np
import pytest
from omni_core.serve.errors import APIError
from omni_core.serve.realtime.conversation_items import read_item
from omni_core.serve.realtime.conversation_session import ConversationSession
from omni_core.serve.realtime.endpoint import session_kind
from omni_core.serve.realtime.realtime_config import CONVERSATION, SPEECH, RealtimeConfig, updated
from omni_core.serve.realtime.sockets import SocketClosed
from omni_core.serve.realtime.speech_session import SpeechSession
from omni_core.serve.realtime.turns import ServerVad
from omni_core.serve.state import ServeConfig, ServerState
from omni_core.surface.audio_codecs import StreamEncoder
from omni_core.surface.inputs import Limits, chat_inputs

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
        100,
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
        100,
    )
    assert reply.message() == {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]}


AUDIO_PART = {"type": "input_audio", "audio": _pcm16(np.zeros(2400))}


@pytest.mark.parametrize(
    "item, param",
    [
        ({"type": "function_call"}, "item.type"),
        ({"role": "tool", "content": [{"type": "input_text", "text": "x"}]}, "item.role"),
        ({"role": "user", "content": []}, "item.content"),
        ({"role": "system", "content": [{"type": "input_audio", "audio": ""}]}, "item.content[0].type"),
        ({"role": "user", "content": [{"type": "input_audio", "audio": ""}]}, "item.content[0].audio"),
        ({"role": "user", "content": [{"type": "input_text", "text": 5}]}, "item.content[0].text"),
        ({"role": "user", "content": [{**AUDIO_PART, "transcript": 5}]}, "item.content[0].transcript"),
        ({"role": "user", "content": [{"type": "input_image", "image_url": "data:,", "detail": "x" * 99}]},
         "item.content[0].detail"),
    ],
)
def test_bad_items_are_refused_by_name(item, param):
    with pytest.raises(APIError) as refused:
        read_item(item, "item", 24000, LIMITS, 100)
    assert refused.value.status == 400 and refused.value.param == param


def test_an_item_holds_a_bounded_text():
    def item(*parts):
        return {"role": "user", "content": list(parts)}

    text = {"type": "input_text", "text": "x" * 60}
    said = {**AUDIO_PART, "transcript": "y" * 41}
    assert read_item(item(text, text), "item", 24000, LIMITS, 120).text == "x" * 120
    for refused_item in (item(text, text, text), item(text, said)):  # a transcript counts too
        with pytest.raises(APIError) as refused:
            read_item(refused_item, "item", 24000, LIMITS, 100)
        assert (refused.value.status, refused.value.code, refused.value.param) == (413, "too_large", "item")


def test_output_audio_is_pcm16_at_the_session_rate():
    same = StreamEncoder("pcm", 24000, out_rate=24000)
    assert same.feed(np.array([0.0, 0.5, -2.0], np.float32)) == np.array([0, 16384, -32768], "<i2").tobytes()
    assert same.close() == b""
    down = StreamEncoder("pcm", 24000, out_rate=16000)
    chunks = [down.feed(np.zeros(2400, np.float32)) for _ in range(10)] + [down.close()]
    assert sum(len(c) for c in chunks) == 16000 * 2  # one second at 16 kHz, every sample sent


# -- sessions driven event by event -------------------------------------------------------------

MAX_CHARS = 100  # --max-input-chars: a speech session speaks at most this, chat text 8 times it


class ScriptedSocket:
    """Stands where a session's socket is: the client's events given in order (each once the
    response in progress, if any, is done: as a client that waits for response.done), the
    server's events kept. The server's state has no model and drains, so every response fails
    before it says anything."""

    def __init__(self, client_events: list[dict]):
        limits = Limits(max_input_chars=MAX_CHARS, max_audio_seconds=5.0)
        self.state = ServerState(ServeConfig(family="f", served_model_name="m", limits=limits))
        self.client_events = list(client_events)
        self.events: list[dict] = []

    async def receive_json(self, busy):
        while busy():
            await asyncio.sleep(0.001)
        if not self.client_events:
            raise SocketClosed()
        return self.client_events.pop(0), None

    async def send(self, event: dict) -> None:
        self.events.append(event)

    def done_with(self, handle) -> None:
        raise AssertionError("no request is submitted while the server drains")

    def of(self, kind: str) -> list[dict]:
        return [event for event in self.events if event["type"] == kind]


def _run(session) -> None:
    async def run():
        await session.state.admission.start_draining()
        worker = asyncio.ensure_future(session.work())
        try:
            await session.receive()
        except SocketClosed:
            pass
        finally:
            worker.cancel()

    asyncio.run(run())


def _message(*parts: dict, item_id: str | None = None, role: str = "user") -> dict:
    item = {"type": "message", "role": role, "content": list(parts)}
    return {"type": "conversation.item.create", "item": item if item_id is None else {**item, "id": item_id}}


def _text(text: str) -> dict:
    return {"type": "input_text", "text": text}


def _speech_session(*events: dict) -> tuple[SpeechSession, ScriptedSocket]:
    socket = ScriptedSocket(list(events))
    session = SpeechSession(socket, RealtimeConfig(model="m", mode=SPEECH, voice="v"))
    _run(session)
    return session, socket


def _conversation(*events: dict, instructions: str | None = None):
    socket = ScriptedSocket(list(events))
    config = RealtimeConfig(model="m", mode=CONVERSATION, instructions=instructions)
    session = ConversationSession(socket, config)
    _run(session)
    return session, socket


def test_a_speech_session_takes_no_more_text_than_one_response_speaks():
    session, socket = _speech_session(
        _message(_text("a" * 60)),
        _message(_text("b" * 60)),  # past --max-input-chars with the first: refused, nothing added
        _message(_text("c" * (MAX_CHARS + 1))),  # one message past it
        {"type": "response.create"},
        {"type": "response.create"},  # nothing left to speak
    )
    errors = [event["error"] for event in socket.of("error")]
    refused = [("too_large", "item")] * 2 + [("empty_input", "response.input")]
    assert [(e["code"], e["param"]) for e in errors] == refused
    assert [e["item"]["role"] for e in socket.of("conversation.item.done")] == ["user", "assistant"]
    spoken = socket.of("response.output_audio_transcript.delta")
    assert [event["delta"] for event in spoken] == ["a" * 60]  # the text kept is spoken
    assert socket.of("response.done")[0]["response"]["status"] == "failed"  # the drain: 503
    assert session.unspoken == []


def test_a_long_text_conversation_keeps_what_one_request_holds():
    chat_chars = 8 * MAX_CHARS
    items = [_message(_text(f"{i}" * MAX_CHARS), item_id=f"item_{i}") for i in range(10)]
    session, socket = _conversation(*items)
    assert [item.id for item in session.items] == [f"item_{i}" for i in range(2, 10)]
    instructions = "i" * (MAX_CHARS + 50)
    session, socket = _conversation(*items, instructions=instructions)
    kept = [item.id for item in session.items]
    assert kept == [f"item_{i}" for i in range(4, 10)]  # the instructions take their room
    messages = [{"role": "system", "content": instructions}] + [item.message() for item in session.items]
    limits = Limits(max_input_chars=MAX_CHARS)
    chat_inputs(messages, target_rate=None, modalities=["text"], voice=None, reference=None,
                reference_text=None, sampling={}, limits=limits)  # within the bound: no 413
    assert sum(len(item.text) for item in session.items) + len(instructions) <= chat_chars
    # a session.update with longer instructions forgets more
    session, socket = _conversation(
        *items, {"type": "session.update", "session": {"type": "realtime", "instructions": instructions}}
    )
    assert [item.id for item in session.items] == kept
    # one message past the chat bound is refused, the conversation unchanged
    session, socket = _conversation(items[0], _message(_text("x" * (chat_chars + 1))))
    assert [e["error"]["code"] for e in socket.of("error")] == ["too_large"]
    assert [item.id for item in session.items] == ["item_0"]


def test_an_item_with_more_spoken_parts_than_the_conversation_keeps_is_refused():
    audio = {"type": "input_audio", "audio": _pcm16(np.zeros(2400))}
    session, socket = _conversation(
        _message(_text("Hello."), item_id="item_a"),
        _message(*[audio] * 5),
        _message(*[audio] * 4, item_id="item_b"),
    )
    errors = [event["error"] for event in socket.of("error")]
    assert [(e["code"], e["param"]) for e in errors] == [("invalid_value", "item.content")]
    assert [item.id for item in session.items] == ["item_a", "item_b"]
    assert session.previous_item == "item_b"


def test_a_response_that_says_nothing_leaves_no_item_behind():
    pcm = _pcm16(np.zeros(4800))  # 200 ms at 24 kHz
    session, socket = _conversation(
        _message(_text("Hello."), item_id="item_a"),
        {"type": "response.create"},  # fails before any text: its item does not join
        {"type": "response.create"},
        {"type": "input_audio_buffer.append", "audio": pcm},
        {"type": "input_audio_buffer.commit"},
    )
    responses = [event["response"] for event in socket.of("response.done")]
    assert [r["status"] for r in responses] == ["failed", "failed"]
    assert responses[0]["status_details"]["error"]["code"] == "draining"
    added = [e["previous_item_id"] for e in socket.of("conversation.item.added")]
    # each response, and the spoken turn after them, follow the user's message
    assert added == [None, "item_a", "item_a", "item_a"]
    assert socket.of("input_audio_buffer.committed")[0]["previous_item_id"] == "item_a"
    turn = socket.of("input_audio_buffer.committed")[0]["item_id"]
    assert [item.id for item in session.items] == ["item_a", turn] and session.previous_item == turn
