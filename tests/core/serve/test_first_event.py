"""Streams: a stream waits for its request's first event before it answers (so that an early
failure is still a JSON error); a client that leaves during that wait must abort the request, as
it does later in the stream (driven on the real runtime with the CosyVoice-shaped toy topology);
a stream cut by a failure says what kind it was, as a reply before the stream would."""

from __future__ import annotations

import asyncio
import time

import pytest
from omni_core.pipeline import Pipeline, RequestFailed
from omni_core.serve.streaming import ClientGone, error_event, events_with_first
from starlette.requests import Request

from tests.core.pipeline import toy_topologies as toy
from tests.core.pipeline.test_segmented import audio_of, wait_idle


def request_whose_client(leaves_after_s: float | None) -> Request:
    """A Starlette request whose client disconnects after ``leaves_after_s`` (None: stays)."""

    async def receive():
        if leaves_after_s is None:
            await asyncio.Event().wait()
        await asyncio.sleep(leaves_after_s)
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)


def test_a_client_leaving_before_the_first_event_aborts_the_request():
    with Pipeline(toy.cosyvoice_like(delay_s=1.0), plugin_manager=toy.core_plugins()) as pipeline:
        handle = pipeline.submit({"text": "slow to start", "steps": 40})
        started = time.monotonic()
        with pytest.raises(ClientGone):
            asyncio.run(events_with_first(request_whose_client(leaves_after_s=0.1), handle))
        assert time.monotonic() - started < 0.9  # not held until the first event (1 s away)
        assert handle.aborted
        assert wait_idle(pipeline, seconds=5)["running"] == 0


def test_a_client_that_stays_gets_the_first_event_and_the_rest():
    async def read_all(handle):
        first, rest = await events_with_first(request_whose_client(leaves_after_s=None), handle)
        return [first, *[event async for event in rest]]

    with Pipeline(toy.cosyvoice_like(delay_s=0.05), plugin_manager=toy.core_plugins()) as pipeline:
        events = asyncio.run(read_all(pipeline.submit({"text": "hello"})))
        assert events[-1].end and not events[0].end
        assert audio_of(events).allclose(toy.reference_cosyvoice("hello"))


def test_a_stream_cut_by_a_content_error_says_so_as_a_reply_before_the_stream_would():
    # a later segment of a long text refused by the llm stage (prompt past max_model_len)
    refused = RequestFailed("llm", "InvalidInput: prompt (3057 tokens) + max_tokens (1560) exceeds the engine's max_model_len 4096")
    error = error_event(refused)["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_input")  # was server_error / stage_failed
    assert "max_model_len" in error["message"]
    crashed = error_event(RequestFailed("flow", "ValueError: boom (at flow.py:3)"))["error"]
    assert (crashed["type"], crashed["code"]) == ("server_error", "stage_failed")
