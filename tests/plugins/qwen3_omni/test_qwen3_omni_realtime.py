"""End to end: /v1/realtime conversation sessions on a real `omni serve --family qwen3-omni
--preset tiny`, driven by the official `openai` SDK's realtime client: a text message answered
with its transcript and pcm16 audio (or with text alone), the conversation kept across turns,
spoken audio streamed in and answered once server VAD ends the turn, and a response cut short
by `response.cancel`, by speech starting (barge-in) and by the client leaving, each freeing its
request and KV blocks in both AR stages within a second. The tiny preset's replies are noise:
shapes, order and status are checked, not content."""

from __future__ import annotations

import base64
import contextlib
import time

import numpy as np
import openai
import pytest
import soundfile as sf
import soxr
from websockets.sync.client import connect

from tests.core.serve.server import metric
from tests.helpers.realtime_events import events_until, events_until_done

from .conftest import tiny_server

pytest.importorskip("silero_vad", reason="server VAD needs omni-core's realtime extra")

# a greedy talker speaks its whole budget: every spoken reply lasts a few seconds on this CPU,
# time enough to cut it short in the middle (the thinker's random text may end at any length)
SPEECH = ("talker_temperature=0", "talker_max_tokens=800", "max_model_len=1024")
AR_STAGES = ("thinker", "talker")
RATE = 24000


@pytest.fixture(scope="module")
def server(omni_cache, tiny_dir, tmp_path_factory):
    with tiny_server(omni_cache, tmp_path_factory.mktemp("qwen3-omni-realtime"), *SPEECH) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def spoken_pcm(tmp_path_factory) -> bytes:
    """A spoken sentence (espeak-ng) as pcm16 at the session's rate."""
    from omni_core.bench.dataset import DatasetError, spoken

    try:
        path = spoken("Tell me something about the weather today.", tmp_path_factory.mktemp("spoken"))
    except DatasetError as exc:
        pytest.skip(str(exc))
    samples, rate = sf.read(path, dtype="float32")
    return (np.clip(soxr.resample(samples, rate, RATE), -1, 1) * 32767).astype("<i2").tobytes()



@contextlib.contextmanager
def _opened(client, **session):
    """A conversation session with ``session`` settings applied."""
    with client.realtime.connect(model="qwen3-omni") as connection:
        created = connection.recv()
        assert created.type == "session.created" and created.session.type == "realtime"
        if session:
            connection.session.update(session={"type": "realtime", **session})
            updated = connection.recv()
            assert updated.type == "session.updated", updated
        yield connection


def _ask(connection, text: str) -> None:
    connection.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )
    assert [e.type for e in events_until(connection, "conversation.item.done")][-1] == "conversation.item.done"


def _append(connection, pcm: bytes, chunk_s: float = 0.1) -> None:
    step = int(RATE * chunk_s) * 2
    for offset in range(0, len(pcm), step):
        connection.input_audio_buffer.append(audio=base64.b64encode(pcm[offset : offset + step]).decode())


def _freed(server, aborted_before: float) -> None:
    """Within a second: no KV block held in either AR stage, no request in any, the abort counted."""
    deadline = time.monotonic() + 1.0
    while True:
        kv = [metric(server.url, "omni_kv_cache_usage", stage=stage) for stage in AR_STAGES]
        held = [metric(server.url, "omni_stage_requests", stage=stage) for stage in AR_STAGES]
        aborted = metric(server.url, "omni_requests_aborted_total", endpoint="/v1/realtime")
        if kv == [0, 0] and held == [0, 0] and aborted >= aborted_before + 1:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"not freed within a second: kv {kv}, stage requests {held}, aborted {aborted}")
        time.sleep(0.05)


def test_text_in_text_and_audio_out_with_the_conversation_kept(client):
    with _opened(client, audio={"input": {"turn_detection": None}}, max_output_tokens=8) as connection:
        _ask(connection, "Good morning! What is new?")
        connection.response.create()
        events = events_until(connection, "response.done")
        kinds = [e.type for e in events]
        assert "error" not in kinds, events[-1]
        transcript = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
        pcm = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
        assert transcript and len(pcm) % 2 == 0 and len(pcm) // 2 >= 1920  # at least one 80 ms frame
        done = events[-1].response
        assert done.status in ("completed", "incomplete")
        assert done.output[0].content[0].transcript == transcript
        assert done.usage.output_tokens >= 1
        # the next turn answers the whole conversation: its prompt holds the first turn and reply
        _ask(connection, "And then?")
        connection.response.create(response={"output_modalities": ["text"]})
        second = events_until(connection, "response.done")
        kinds = [e.type for e in second]
        assert "response.output_text.delta" in kinds and "response.output_audio.delta" not in kinds
        text = "".join(e.delta for e in second if e.type == "response.output_text.delta")
        assert second[-1].response.output[0].content[0].text == text
        assert second[-1].response.usage.input_tokens > done.usage.input_tokens + done.usage.output_tokens


def test_every_server_event_is_the_sdk_type_of_its_name(server):
    url = server.url.replace("http://", "ws://") + "/v1/realtime?model=qwen3-omni"
    with connect(url, open_timeout=30) as ws:
        ask = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi!"}]}
        session = {"type": "realtime", "max_output_tokens": 4, "audio": {"input": {"turn_detection": None}}}
        events = events_until_done(
            ws,
            [
                {"type": "session.update", "session": session},
                {"type": "input_audio_buffer.commit"},  # nothing to commit: an error event
                {"type": "conversation.item.create", "item": ask},
                {"type": "response.create"},
            ],
        )
    kinds = {event["type"] for event in events}
    assert {"session.created", "session.updated", "error", "response.output_audio.delta"} <= kinds


def test_spoken_turn_is_answered_when_server_vad_ends_it(client, spoken_pcm):
    with _opened(
        client,
        audio={"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 300}}},
        max_output_tokens=6,
    ) as connection:
        _append(connection, bytes(RATE) + spoken_pcm + bytes(RATE * 2))
        events = events_until(connection, "response.done")
        kinds = [e.type for e in events]
        assert "error" not in kinds, events[-1]
        expected = [
            "input_audio_buffer.speech_started",
            "input_audio_buffer.speech_stopped",
            "input_audio_buffer.committed",
            "response.created",
            "response.done",
        ]
        order = [kind for kind in kinds if kind in expected]
        assert order == expected, order
        assert "response.output_audio.delta" in kinds
        assert events[-1].response.status in ("completed", "incomplete")


def test_a_long_spoken_conversation_keeps_its_newest_turns(client):
    # more spoken turns than a request may hold audio parts (the family's max_audios, 8): the
    # conversation keeps the newest, and every response is still answered
    noise = (np.random.default_rng(0).standard_normal(RATE // 2) * 0.1).astype(np.float32)
    turn = base64.b64encode((noise * 32767).astype("<i2").tobytes()).decode()
    with _opened(client, audio={"input": {"turn_detection": None}}, max_output_tokens=2) as connection:
        for _ in range(10):
            connection.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": turn}]}
            )
            events_until(connection, "conversation.item.done")
        connection.response.create(response={"output_modalities": ["text"]})
        done = events_until(connection, "response.done")[-1]
        assert done.type == "response.done" and done.response.status in ("completed", "incomplete"), done


def test_response_cancel_frees_the_request(server, client):
    aborted = metric(server.url, "omni_requests_aborted_total", endpoint="/v1/realtime")
    with _opened(client, audio={"input": {"turn_detection": None}}, max_output_tokens=400) as connection:
        _ask(connection, "Tell me a long story.")
        connection.response.create()
        events_until(connection, "response.output_audio.delta")  # speaking: both AR stages hold the request
        connection.response.cancel()
        done = events_until(connection, "response.done")[-1].response
        assert done.status == "cancelled" and done.status_details.reason == "client_cancelled", done
        _freed(server, aborted)


def test_speech_starting_cancels_the_response(server, client, spoken_pcm):
    aborted = metric(server.url, "omni_requests_aborted_total", endpoint="/v1/realtime")
    with _opened(
        client,
        audio={"input": {"turn_detection": {"type": "server_vad", "create_response": False}}},
        max_output_tokens=400,
    ) as connection:
        _ask(connection, "Tell me a long story.")
        connection.response.create()
        events_until(connection, "response.output_audio.delta")  # speaking: both AR stages hold the request
        _append(connection, spoken_pcm[: RATE * 2])  # the user speaks over the reply
        events = events_until(connection, "response.done")
        kinds = [e.type for e in events]
        assert "input_audio_buffer.speech_started" in kinds, kinds
        done = events[-1].response
        assert done.status == "cancelled" and done.status_details.reason == "turn_detected", done
        _freed(server, aborted)


def test_a_client_that_leaves_mid_response_frees_its_request(server, client):
    aborted = metric(server.url, "omni_requests_aborted_total", endpoint="/v1/realtime")
    with _opened(client, audio={"input": {"turn_detection": None}}, max_output_tokens=400) as connection:
        _ask(connection, "Tell me a long story.")
        connection.response.create()
        events_until(connection, "response.output_audio.delta")
    _freed(server, aborted)
    assert metric(server.url, "omni_running_requests") == 0  # the session's slot is back too


def test_bad_items_and_responses_get_error_events(client):
    bad = [
        ({"type": "conversation.item.create", "item": {"type": "message", "role": "robot", "content": []}},
         "invalid_value"),
        ({"type": "conversation.item.create", "previous_item_id": "item_missing",
          "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]}},
         "invalid_value"),
        ({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
          "content": [{"type": "input_audio", "audio": "%%%"}]}}, "invalid_value"),
        ({"type": "response.create", "response": {"output_modalities": ["video"]}}, "invalid_value"),
        ({"type": "response.create", "response": {"audio": {"output": {"voice": "nobody"}}}},
         "unknown_voice"),
        ({"type": "input_audio_buffer.commit"}, "input_audio_buffer_commit_empty"),
        ({"type": "output_audio_buffer.clear"}, "unknown_event"),
    ]
    with _opened(client) as connection:
        for event, code in bad:
            connection.send(event)
            answer = connection.recv()
            assert answer.type == "error" and answer.error.code == code, (event, answer)
