"""End to end: /v1/realtime speech sessions on a real `omni serve --family cosyvoice3 --preset
tiny`, driven by the official `openai` SDK's realtime client: text added as a user message and a
`response.create` come back as pcm16 audio deltas at the session's output rate and a completed
`response.done`; an unknown voice is an `error` event on a socket that goes on working;
`response.cancel` and a client that leaves mid-response free the request in every stage. The
tiny preset's audio is noise: lengths, order and status are checked, not sound."""

from __future__ import annotations

import base64
import time

import openai
import pytest
from websockets.sync.client import connect

from tests.core.serve.server import metric
from tests.helpers.realtime_events import events_until, events_until_done
from tests.helpers.server import OmniServer

KEY = "realtime-speech-key"
STAGES = ("llm", "flow", "hift")
TEXT = "Hello there, this is a speech session."


@pytest.fixture(scope="module")
def server(tiny_dir, omni_cache, tmp_path_factory):
    proc = OmniServer(
        "cosyvoice3",
        tmp_path_factory.mktemp("cosyvoice3-realtime"),
        "--preset",
        "tiny",
        "--api-key",
        KEY,
        "--option",
        "min_length_blocks=all",  # replies long enough to cancel in the middle of one
        OMNI_PLUGINS="cosyvoice3",
        OMNI_CACHE=str(omni_cache),
        OMP_NUM_THREADS="1",
    )
    proc.wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=60)



def _say(connection, text: str) -> None:
    connection.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )
    kinds = [e.type for e in events_until(connection, "conversation.item.done")]
    assert kinds == ["conversation.item.added", "conversation.item.done"], kinds


def _freed(server, aborted_before: float, sessions: int = 0) -> None:
    """Within a second, no request holds state in any stage (nor a KV block in the LM), and the
    abort was counted; ``sessions`` still open each hold their admission slot."""
    deadline = time.monotonic() + 1.0
    while True:
        freed = (
            metric(server.url, "omni_running_requests") == sessions
            and metric(server.url, "omni_kv_cache_usage", stage="llm") == 0
            and all(metric(server.url, "omni_stage_requests", stage=stage) == 0 for stage in STAGES)
        )
        aborted = metric(server.url, "omni_requests_aborted_total", endpoint="/v1/realtime")
        if freed and aborted >= aborted_before + 1:
            return
        if time.monotonic() > deadline:
            stages = {stage: metric(server.url, "omni_stage_requests", stage=stage) for stage in STAGES}
            running = metric(server.url, "omni_running_requests")
            pytest.fail(f"not freed within a second: running {running}, stages {stages}, aborted {aborted}")
        time.sleep(0.05)


def test_text_in_speech_out(client):
    with client.realtime.connect(model="cosyvoice3") as connection:
        created = connection.recv()
        assert created.type == "session.created" and created.session.type == "realtime"
        assert created.session.audio.output.voice == "default"
        connection.session.update(
            session={
                "type": "realtime",
                "audio": {"output": {"format": {"type": "audio/pcm", "rate": 16000}}},
            }
        )
        updated = connection.recv()
        assert updated.type == "session.updated", updated
        assert updated.session.audio.output.format.rate == 16000
        _say(connection, TEXT)
        connection.response.create()
        events = events_until(connection, "response.done")
    kinds = [e.type for e in events]
    assert "error" not in kinds, events[-1]
    assert kinds[:4] == [
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
    ]
    assert kinds[-6:] == [
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    response_id = events[0].response.id
    deltas = [e for e in events if e.type == "response.output_audio.delta"]
    assert deltas and all(d.response_id == response_id and d.item_id == events[1].item.id for d in deltas)
    pcm = b"".join(base64.b64decode(d.delta) for d in deltas)
    assert len(pcm) % 2 == 0 and len(pcm) // 2 > 1600  # pcm16, more than 0.1 s at 16 kHz
    assert any(pcm[i] for i in range(len(pcm)))
    done = events[-1].response
    assert done.status == "completed" and done.id == response_id
    assert done.usage.input_tokens >= 1 and done.usage.output_tokens >= 1  # the speech LM's tokens
    assert done.output[0].content[0].transcript == TEXT
    assert events[-5].transcript == TEXT


def test_every_server_event_is_the_sdk_type_of_its_name(server):
    url = server.url.replace("http://", "ws://") + "/v1/realtime?model=cosyvoice3"
    with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=30) as ws:
        say = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": TEXT}]}
        events = events_until_done(
            ws,
            [
                {"type": "session.update", "session": {"type": "realtime", "instructions": None}},
                {"type": "response.cancel"},  # nothing to cancel: an error event
                {"type": "conversation.item.create", "item": say},
                {"type": "response.create"},
            ],
        )
    kinds = {event["type"] for event in events}
    assert {"session.created", "session.updated", "error", "response.output_audio.delta"} <= kinds


def test_voice_from_session_update_and_unknown_voice(client):
    with client.realtime.connect(model="cosyvoice3") as connection:
        assert connection.recv().type == "session.created"
        connection.session.update(session={"type": "realtime", "audio": {"output": {"voice": "nobody"}}})
        refused = connection.recv()
        assert refused.type == "error" and refused.error.code == "unknown_voice", refused
        assert "nobody" in refused.error.message and refused.error.param == "session.audio.output.voice"
        connection.response.create()  # nothing said yet: refused, the socket stays open
        empty = connection.recv()
        assert empty.type == "error" and empty.error.code == "empty_input"
        by_id = {"type": "realtime", "audio": {"output": {"voice": {"id": "default"}}}}
        connection.session.update(session=by_id)
        assert connection.recv().session.audio.output.voice == "default"
        _say(connection, "Still here.")
        connection.response.create(response={"audio": {"output": {"voice": "nobody"}}})
        assert connection.recv().error.code == "unknown_voice"
        connection.response.create()
        events = events_until(connection, "response.done")
        assert events[-1].type == "response.done" and events[-1].response.status == "completed"
        assert any(e.type == "response.output_audio.delta" for e in events)


def test_bad_events_get_error_events(client):
    bad = [
        ({"type": "session.update", "session": {"type": "transcription"}}, "invalid_value"),
        ({"type": "session.update", "session": {"output_modalities": ["text"]}}, "invalid_value"),
        (
            {
                "type": "session.update",
                "session": {"audio": {"input": {"turn_detection": {"type": "server_vad"}}}},
            },
            "invalid_value",
        ),
        ({"type": "input_audio_buffer.append", "audio": ""}, "unknown_event"),
        ({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
          "content": [{"type": "input_audio", "audio": ""}]}}, "invalid_value"),
        ({"type": "conversation.item.create", "item": {"type": "function_call"}}, "invalid_value"),
        ({"type": "response.cancel"}, "response_cancel_not_active"),
    ]
    with client.realtime.connect(model="cosyvoice3") as connection:
        assert connection.recv().type == "session.created"
        for event, code in bad:
            connection.send(event)
            answer = connection.recv()
            assert answer.type == "error" and answer.error.code == code, (event, answer)
        _say(connection, "Fine.")
        connection.response.create()
        assert events_until(connection, "response.done")[-1].response.status == "completed"


def test_response_cancel_ends_the_response_and_frees_its_request(server, client):
    aborted = metric(server.url, "omni_requests_aborted_total", endpoint="/v1/realtime")
    with client.realtime.connect(model="cosyvoice3") as connection:
        assert connection.recv().type == "session.created"
        _say(connection, "speak these words one after another " * 6)
        connection.response.create()
        events_until(connection, "response.output_audio.delta")  # speaking: its request holds stage state
        connection.response.cancel()
        events = events_until(connection, "response.done")
        done = events[-1].response
        assert done.status == "cancelled" and done.status_details.reason == "client_cancelled", done
        _freed(server, aborted, sessions=1)
        _say(connection, "And after that.")  # the session goes on
        connection.response.create()
        assert events_until(connection, "response.done")[-1].response.status == "completed"


def test_a_client_that_leaves_mid_response_frees_its_request(server, client):
    aborted = metric(server.url, "omni_requests_aborted_total", endpoint="/v1/realtime")
    with client.realtime.connect(model="cosyvoice3") as connection:
        assert connection.recv().type == "session.created"
        _say(connection, "speak these words one after another " * 6)
        connection.response.create()
        events_until(connection, "response.output_audio.delta")
    _freed(server, aborted)
