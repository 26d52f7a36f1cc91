"""Stages in spawned processes: same results as in one process, over shm and over zmq/tcp;
abort, a stage exception, a killed stage process, a stage that cannot start; nothing left in
/dev/shm. Each pipeline here spawns real Python processes (a few seconds each)."""

from __future__ import annotations

import functools
import glob
import os
import signal
import time

import pytest
import torch
from omni_core.pipeline import Pipeline, RequestFailed

from tests.core.pipeline import toy_topologies as toy


def audio_of(events) -> torch.Tensor:
    return torch.cat([e.payload["audio"] for e in events if "audio" in e.payload])


def shm_entries(pipeline) -> list[str]:
    return glob.glob(f"/dev/shm/{pipeline.prefix}*")


def test_omni_shape_with_encoder_and_feedback_loop_in_processes_over_shm():
    audio, image = torch.randn(96_000), torch.randn(8, 8)  # 384 KB: travels in shared memory
    pipeline = Pipeline(
        toy.omni_like(),
        plugin_manager=toy.core_plugins(),
        placement={"audio_encoder": "process", "talker": "process"},  # talker <-> code_predictor crosses
        transport="shm",
        rebuild=functools.partial(toy.build, "omni"),
    )
    with pipeline:
        pids = pipeline.stage_pids()
        assert set(pids) == {"audio_encoder", "talker"} and os.getpid() not in pids.values()
        handles = [
            pipeline.submit({"text": "hi", "audio": audio, "image": image, "modalities": ["text", "audio"]}),
            pipeline.submit({"text": "yo", "audio": audio, "modalities": ["text", "audio"]}),
            pipeline.submit({"text": "text only"}),
        ]
        results = [h.collect(timeout=30) for h in handles]
        ref_text, ref_audio = toy.reference_omni("hi", audio, image)
        assert results[0]["text"][-1].payload["text"] == ref_text
        assert torch.allclose(audio_of(results[0]["audio"]), ref_audio)
        assert torch.allclose(audio_of(results[1]["audio"]), toy.reference_omni("yo", audio)[1])
        assert set(results[2]) == {"text"}
        more = [pipeline.submit({"text": f"again {i}", "audio": audio}).collect(timeout=30) for i in range(3)]
        assert all(r["text"][-1].payload["parts"] == ["audio", "text"] for r in more)
        # at most the reusable pool segments remain while running (one per direction; whether one
        # is mapped at this instant depends on when the receiver's finalizer handed it back)
        entries = shm_entries(pipeline)
        assert all("-pool-" in path for path in entries) and len(entries) <= 4, entries
        assert pipeline.stats()["stages"]["talker"]["placement"] == "process"
    assert shm_entries(pipeline) == []
    assert all(not _alive(pid) for pid in pids.values())


def test_zmq_over_tcp_stage_exception_and_abort_in_a_stage_process():
    pipeline = Pipeline(
        toy.cosyvoice_like(delay_s=0.02, fail_stage="llm"),
        plugin_manager=toy.core_plugins(),
        placement={"llm": "process"},
        transport="zmq",
        control="tcp",
        rebuild=functools.partial(toy.build, "cosyvoice", delay_s=0.02, fail_stage="llm"),
    )
    with pipeline:
        good = pipeline.submit({"text": "fine"})
        with pytest.raises(RequestFailed, match="stage 'llm' failed: ValueError: cannot process 'boom'"):
            pipeline.submit({"text": "boom"}).collect(timeout=20)
        assert torch.allclose(audio_of(good.collect(timeout=20)["audio"]), toy.reference_cosyvoice("fine"))

        long = pipeline.submit({"text": "long", "steps": 2000})
        assert long.get(timeout=20).name == "audio"
        long.abort()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            llm = pipeline.stats()["stages"]["llm"]
            if llm["inflight"] == 0 and llm.get("busy") == 0 and llm.get("running") == 0:
                break
            time.sleep(0.02)
        assert llm["inflight"] == 0 and llm["busy"] == 0 and llm["running"] == 0, llm
        assert list(long) == []


def test_killed_stage_process_fails_its_requests_and_is_restarted():
    pipeline = Pipeline(
        toy.fish_like(),
        plugin_manager=toy.core_plugins(),
        placement={"dual_ar": "process"},
        rebuild=functools.partial(toy.build, "fish"),
    )
    with pipeline:
        first_pid = pipeline.stage_pids()["dual_ar"]
        before = pipeline.submit({"text": "ok"}).collect(timeout=20)
        assert torch.allclose(audio_of(before["audio"]), toy.reference_fish("ok"))

        handle = pipeline.submit({"text": "in flight", "frames": 400, "delay_s": 0.02})
        assert handle.get(timeout=20).name == "audio"  # the stage process is mid-stream
        os.kill(first_pid, signal.SIGKILL)
        with pytest.raises(
            RequestFailed, match=r"stage 'dual_ar' failed: stage process died \(exit code -9\)"
        ):
            handle.get(timeout=2.0)  # detected within 2 s

        after = pipeline.submit({"text": "after restart"}).collect(timeout=30)  # waits for the new child
        assert torch.allclose(audio_of(after["audio"]), toy.reference_fish("after restart"))
        stats = pipeline.stats()["stages"]["dual_ar"]
        assert stats["restarts"] == 1 and stats["pid"] != first_pid and stats["state"] == "running"
    assert shm_entries(pipeline) == []


def test_a_stage_that_cannot_start_in_its_process_is_a_clear_error():
    pipeline = Pipeline(
        toy.asr_like(),
        plugin_manager=toy.core_plugins(),
        placement={"decoder": "process"},
        rebuild=functools.partial(toy.build, "asr", broken_stage="decoder"),
    )
    with pytest.raises(
        RuntimeError, match="stage 'decoder' failed to start: .*RuntimeError: decoder weights missing"
    ):
        pipeline.start()
    assert shm_entries(pipeline) == []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped) still answers; check its state
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def test_a_rebuild_that_cannot_pickle_is_refused_before_any_process_starts():
    """A family whose build is a lambda: refused when the pipeline is made, naming why, not when
    the first stage process is spawned (after the server already listens)."""
    topology = toy.build("omni")
    with pytest.raises(ValueError, match=r"family's build must be picklable .*lambda"):
        Pipeline(topology, plugin_manager=toy.core_plugins(), placement={"talker": "process"}, transport="shm",
                 rebuild=lambda: toy.build("omni"))
