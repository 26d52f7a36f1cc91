"""The four topology shapes, in one process: results equal a direct computation; fan-out,
fan-in, feedback, batching, a stage exception, abort, async iteration."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from omni_core.pipeline import Pipeline, PipelineFull, RequestFailed, StageSpec, Topology

from tests.core.pipeline import toy_topologies as toy


def audio_of(events) -> torch.Tensor:
    return torch.cat([e.payload["audio"] for e in events if "audio" in e.payload])


def test_cosyvoice_shape_streams_audio_equal_to_direct_computation():
    with Pipeline(toy.cosyvoice_like(), plugin_manager=toy.core_plugins()) as pipeline:
        handles = {text: pipeline.submit({"text": text}) for text in ["hello", "omni", "speech", "x"]}
        for text, handle in handles.items():
            events = handle.collect(timeout=10)["audio"]
            assert [e.seq for e in events] == list(range(len(events)))
            assert [e.end for e in events] == [False] * (len(events) - 1) + [True]
            assert torch.allclose(audio_of(events), toy.reference_cosyvoice(text))
        stats = pipeline.stats()
        assert stats["running"] == 0
        assert all(s["running"] == 0 and s["queue_depth"] == 0 for s in stats["stages"].values())


def test_omni_shape_fans_out_by_content_and_joins_what_each_request_brings():
    audio, image = torch.randn(96), torch.randn(8, 8)
    with Pipeline(toy.omni_like(), plugin_manager=toy.core_plugins()) as pipeline:
        full = pipeline.submit(
            {"text": "hi", "audio": audio, "image": image, "modalities": ["text", "audio"]}
        )
        text_only = pipeline.submit({"text": "hi"})
        with_image = pipeline.submit({"text": "yo", "image": image})

        out = full.collect(timeout=10)
        ref_text, ref_audio = toy.reference_omni("hi", audio, image)
        assert full.expected_outputs == ("audio", "text")
        assert out["text"][-1].payload == {"text": ref_text, "parts": ["audio", "image", "text"]}
        assert "".join(e.payload["text"] for e in out["text"][:-1]) == ref_text
        assert torch.allclose(audio_of(out["audio"]), ref_audio)  # five talker <-> predictor steps

        out = text_only.collect(timeout=10)
        assert set(out) == {"text"} and text_only.expected_outputs == ("text",)
        assert out["text"][-1].payload == {"text": toy.reference_omni("hi")[0], "parts": ["text"]}
        assert with_image.collect(timeout=10)["text"][-1].payload["parts"] == ["image", "text"]

        stages = pipeline.stats()["stages"]
        assert stages["audio_encoder"]["processed"] == 1  # only the request with audio went there
        assert stages["image_encoder"]["processed"] == 2
        assert stages["talker"]["running"] == 0 and pipeline.executors["talker"].worker.state == {}


def test_fish_and_asr_shapes_and_batching_of_concurrent_requests():
    ref_audio = torch.randn(60)
    with Pipeline(toy.fish_like(), plugin_manager=toy.core_plugins()) as pipeline:
        out = pipeline.submit({"text": "clone me", "reference_audio": ref_audio}).collect(timeout=10)
        assert torch.allclose(audio_of(out["audio"]), toy.reference_fish("clone me", ref_audio))
    clips = [torch.randn(800 + 160 * i) for i in range(6)]
    with Pipeline(toy.asr_like(), plugin_manager=toy.core_plugins()) as pipeline:
        handles = [pipeline.submit({"audio": clip}) for clip in clips]
        texts = [h.collect(timeout=10)["text"] for h in handles]
        for clip, events in zip(clips, texts, strict=False):
            assert events[-1].payload["text"] == toy.reference_asr(clip)
            assert "".join(e.payload["text"] for e in events[:-1]) == events[-1].payload["text"]
        assert max(pipeline.executors["encoder"].worker.batch_sizes) > 1  # grouped within the window


def test_stage_exception_fails_only_that_request_and_names_the_stage(caplog):
    with Pipeline(toy.cosyvoice_like(fail_stage="flow"), plugin_manager=toy.core_plugins()) as pipeline:
        good = [pipeline.submit({"text": f"fine {i}"}) for i in range(3)]
        bad = pipeline.submit({"text": "boom"})
        with pytest.raises(RequestFailed) as failure:
            bad.collect(timeout=10)
        assert failure.value.stage == "flow"
        assert (
            "flow" in str(failure.value)
            and "ValueError" in str(failure.value)
            and "boom" in str(failure.value)
        )
        assert "toy_topologies.py:" in str(failure.value) and "/" not in str(failure.value).split(" (at ")[-1]
        # the server's log keeps the traceback; the client sees the file's name and line only
        logged = [r for r in caplog.records if r.name == "omni.stage" and r.exc_info]
        assert logged and "flow" in logged[0].getMessage() and logged[0].exc_info[0] is ValueError
        for i, handle in enumerate(good):
            assert torch.allclose(
                audio_of(handle.collect(timeout=10)["audio"]), toy.reference_cosyvoice(f"fine {i}")
            )
        assert pipeline.stats()["running"] == 0


def test_abort_stops_work_in_every_stage_within_one_second():
    with Pipeline(toy.cosyvoice_like(delay_s=0.02), plugin_manager=toy.core_plugins()) as pipeline:
        handle = pipeline.submit({"text": "long", "steps": 2000})  # ~10 s of chunks if left alone
        first = handle.get(timeout=10)
        assert first.name == "audio" and not first.end
        handle.abort()
        started = time.monotonic()
        while time.monotonic() - started < 1.0:
            stages = pipeline.stats()["stages"]
            if all(s["busy"] == 0 and s["running"] == 0 and s["queue_depth"] == 0 for s in stages.values()):
                break
            time.sleep(0.01)
        assert all(s["busy"] == 0 and s["running"] == 0 for s in stages.values()), stages
        assert list(handle) == [] and handle.aborted  # no more events after abort
        after = pipeline.submit({"text": "next"}).collect(timeout=10)  # the stage is free again
        assert torch.allclose(audio_of(after["audio"]), toy.reference_cosyvoice("next"))


def test_async_iteration_and_request_limits():
    async def consume(pipeline):
        handle = pipeline.submit({"text": "async"}, request_id="r-1")
        with pytest.raises(ValueError, match="already running"):
            pipeline.submit({"text": "again"}, request_id="r-1")
        return [event async for event in handle]

    with Pipeline(toy.cosyvoice_like(), max_running=1, plugin_manager=toy.core_plugins()) as pipeline:
        events = asyncio.run(consume(pipeline))
        assert torch.allclose(audio_of(events), toy.reference_cosyvoice("async"))
        slow = pipeline.submit({"text": "a"})
        with pytest.raises(PipelineFull):
            pipeline.submit({"text": "b"})
        slow.collect(timeout=10)
        with pytest.raises(TypeError, match="inputs must be a dict"):
            pipeline.submit(["not", "a", "dict"])
    with pytest.raises(RuntimeError, match="not running"):
        pipeline.submit({"text": "after shutdown"})


def wrong_port_factory(context):
    def run(message, emit):
        emit("wav", {"x": 1})

    return run


def test_emitting_on_an_undeclared_output_fails_the_request_clearly():
    topology = Topology(
        stages=[StageSpec("vocoder", "fn", wrong_port_factory, outputs=("audio",))],
        edges=[],
        entry="vocoder.in",
        outputs={"audio": "vocoder.audio"},
    )
    with Pipeline(topology, plugin_manager=toy.core_plugins()) as pipeline:
        with pytest.raises(
            RequestFailed, match="stage 'vocoder' failed: emitted on 'wav', which is not one of its outputs"
        ):
            pipeline.submit({}).collect(timeout=10)

        async def consume():
            return [event async for event in pipeline.submit({})]

        with pytest.raises(RequestFailed, match="'wav'"):  # the same from an event loop
            asyncio.run(consume())
        assert pipeline.stats()["running"] == 0


def test_shutdown_fails_what_still_runs_and_is_idempotent():
    pipeline = Pipeline(toy.cosyvoice_like(delay_s=0.02), plugin_manager=toy.core_plugins()).start()
    handle = pipeline.submit({"text": "long", "steps": 2000})
    assert handle.get(timeout=10).name == "audio"
    pipeline.shutdown()
    with pytest.raises(RequestFailed, match="pipeline shut down"):
        list(handle)
    pipeline.shutdown()
    assert all(s["busy"] == 0 for s in pipeline.stats()["stages"].values())
