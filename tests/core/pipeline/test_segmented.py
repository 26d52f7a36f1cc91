"""A request served as several pipeline requests in turn (``SegmentedHandle``), on the real
runtime with the CosyVoice-shaped toy topology: the parts' audio in order equals each part's
reference, sync and async; failures and aborts stop every part and leave nothing running."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from omni_core.pipeline import Pipeline, RequestFailed, SegmentedHandle

from tests.core.pipeline import toy_topologies as toy

TEXTS = ["first part", "second", "the third part", "4th"]


def audio_of(events) -> torch.Tensor:
    return torch.cat([e.payload["audio"] for e in events if "audio" in e.payload])


def wait_idle(pipeline: Pipeline, seconds: float = 2.0) -> dict:
    started = time.monotonic()
    while True:
        stats = pipeline.stats()
        if stats["running"] == 0 or time.monotonic() - started > seconds:
            return stats
        time.sleep(0.01)


def test_parts_run_in_turn_and_read_as_one_request():
    with Pipeline(toy.cosyvoice_like(delay_s=0.01), plugin_manager=toy.core_plugins()) as pipeline:
        handle = SegmentedHandle(pipeline, [{"text": t} for t in TEXTS], request_id="long")
        assert pipeline.stats()["running"] == 2  # the part being read and one ahead
        assert handle.expected_outputs == ("audio",) and not handle.done
        events = handle.collect(timeout=10)["audio"]
        assert torch.allclose(audio_of(events), torch.cat([toy.reference_cosyvoice(t) for t in TEXTS]))
        assert [e.seq for e in events] == list(range(len(events)))
        assert [e.end for e in events] == [False] * (len(events) - 1) + [True]  # only the last part ends it
        assert handle.done and not handle.aborted
        assert wait_idle(pipeline)["running"] == 0


def test_with_none_ahead_each_part_starts_once_the_one_before_ended():
    # what FamilySpec.segments_in_turn asks for: a part's input may depend on the one before
    with Pipeline(toy.cosyvoice_like(delay_s=0.01), plugin_manager=toy.core_plugins()) as pipeline:
        handle = SegmentedHandle(pipeline, [{"text": t} for t in TEXTS], ahead=0)
        running = []
        events = []
        while (event := handle.get(timeout=10)) is not None:
            running.append(pipeline.stats()["running"])
            events.append(event)
        assert max(running) == 1
        assert torch.allclose(audio_of(events), torch.cat([toy.reference_cosyvoice(t) for t in TEXTS]))


def test_async_iteration_gives_the_same_events():
    async def consume(handle):
        return [event async for event in handle]

    with Pipeline(toy.cosyvoice_like(), plugin_manager=toy.core_plugins()) as pipeline:
        events = asyncio.run(consume(SegmentedHandle(pipeline, [{"text": t} for t in TEXTS], ahead=2)))
        assert torch.allclose(audio_of(events), torch.cat([toy.reference_cosyvoice(t) for t in TEXTS]))
        assert [e.end for e in events].count(True) == 1 and events[-1].end


def test_a_failing_part_fails_the_request_and_stops_the_others():
    with Pipeline(toy.cosyvoice_like(fail_stage="flow", delay_s=0.01), plugin_manager=toy.core_plugins()) as pipeline:
        handle = SegmentedHandle(pipeline, [{"text": "fine"}, {"text": "boom"}, {"text": "never"}])
        with pytest.raises(RequestFailed) as failure:
            handle.collect(timeout=10)
        assert failure.value.stage == "flow" and "boom" in str(failure.value)
        assert wait_idle(pipeline)["running"] == 0  # the part submitted ahead was aborted
        assert handle.done


def test_abort_stops_every_part():
    with Pipeline(toy.cosyvoice_like(delay_s=0.02), plugin_manager=toy.core_plugins()) as pipeline:
        handle = SegmentedHandle(pipeline, [{"text": "long", "steps": 2000}, {"text": "more", "steps": 2000}, {"text": "x"}])
        first = handle.get(timeout=10)
        assert first.name == "audio" and not first.end
        handle.abort()
        assert handle.aborted and handle.done and list(handle) == []
        assert wait_idle(pipeline)["running"] == 0
        after = pipeline.submit({"text": "next"}).collect(timeout=10)  # the stages are free again
        assert torch.allclose(audio_of(after["audio"]), toy.reference_cosyvoice("next"))


def test_a_part_that_cannot_start_fails_the_request():
    with Pipeline(toy.cosyvoice_like(delay_s=0.01), max_running=1, plugin_manager=toy.core_plugins()) as pipeline:
        with pytest.raises(RequestFailed, match="part 2 of 2 could not start"):
            SegmentedHandle(pipeline, [{"text": "a"}, {"text": "b"}])  # the second exceeds max_running
        assert wait_idle(pipeline)["running"] == 0
        with pytest.raises(ValueError, match="at least one part"):
            SegmentedHandle(pipeline, [])
