"""Request deadlines and stage restarts on a real pipeline whose dual_ar stage runs in a spawned
process: a request past its deadline stops in every stage and leaves nothing behind; a SIGKILLed
stage fails its requests as transient (``StageUnavailable``); a request sent during the restart
waits for it, or fails as transient when its deadline passes first."""

from __future__ import annotations

import functools
import glob
import os
import signal
import time

import pytest
import torch
from omni_core.pipeline import DeadlineExceeded, Pipeline, RequestFailed, StageUnavailable

from tests.core.pipeline import toy_topologies as toy


@pytest.fixture(scope="module")
def pipeline():
    placed = Pipeline(
        toy.fish_like(),
        plugin_manager=toy.core_plugins(),
        placement={"dual_ar": "process"},
        rebuild=functools.partial(toy.build, "fish"),
    )
    with placed:
        yield placed
    assert glob.glob(f"/dev/shm/{placed.prefix}*") == []


def audio_of(events) -> torch.Tensor:
    return torch.cat([e.payload["audio"] for e in events["audio"] if "audio" in e.payload])


def settled(pipeline, timeout_s: float = 5.0) -> dict:
    """The stages' stats once no request holds work anywhere (or as they are at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stages = pipeline.stats()["stages"]
        idle = all(s.get("inflight", 0) == 0 and s.get("busy", 0) == 0 and s.get("running", 0) == 0 for s in stages.values())
        if idle or time.monotonic() > deadline:
            return stages
        time.sleep(0.02)


def test_a_request_past_its_deadline_stops_in_every_stage(pipeline):
    handle = pipeline.submit({"text": "slow", "frames": 400, "delay_s": 0.02}, deadline=time.monotonic() + 0.5)
    assert handle.get(timeout=20).name == "audio"  # running in the stage process when the deadline passes
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="ran past its deadline"):
        while handle.get(timeout=5) is not None:
            pass
    assert time.monotonic() - started < 2  # stopped at its deadline, not after its 8 s of work
    assert handle.error is not None and not handle.aborted
    stages = settled(pipeline)
    assert all(s.get("inflight", 0) == 0 and s.get("busy", 0) == 0 and s.get("running", 0) == 0 for s in stages.values()), stages
    assert pipeline.running() == []
    # what remains in shared memory is the reusable pool, nothing of the request
    assert all("-pool-" in path for path in glob.glob(f"/dev/shm/{pipeline.prefix}*"))

    # a deadline that does not pass changes nothing, and passing it after the end does nothing
    fine = pipeline.submit({"text": "in time"}, deadline=time.monotonic() + 0.3)
    assert torch.allclose(audio_of(fine.collect(timeout=20)), toy.reference_fish("in time"))
    time.sleep(0.4)
    assert fine.error is None and pipeline.running() == []


def test_a_killed_stage_fails_its_requests_as_transient_and_later_ones_wait_for_it(pipeline):
    pid = pipeline.stage_pids()["dual_ar"]
    in_flight = pipeline.submit({"text": "in flight", "frames": 400, "delay_s": 0.02})
    assert in_flight.get(timeout=20).name == "audio"
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(StageUnavailable, match=r"stage 'dual_ar' failed: stage process died \(exit code -9\); it is being restarted") as failed:
        while in_flight.get(timeout=5) is not None:  # frames queued before the kill come first
            pass
    assert failed.value.retry_after >= 1  # about as long as the stage took to start

    deadline = time.monotonic() + 5
    while pipeline.stats()["stages"]["dual_ar"]["state"] != "restarting" and time.monotonic() < deadline:
        time.sleep(0.005)
    assert pipeline.stats()["stages"]["dual_ar"]["state"] == "restarting"
    # sent during the restart: one waits (its deadline is long enough), one cannot wait that long
    patient = pipeline.submit({"text": "patient"}, deadline=time.monotonic() + 60)
    hasty = pipeline.submit({"text": "hasty"}, deadline=time.monotonic() + 0.2)
    with pytest.raises(StageUnavailable, match="deadline passed while it waited") as late:
        hasty.collect(timeout=5)
    assert late.value.stage == "dual_ar" and late.value.retry_after >= 1
    assert torch.allclose(audio_of(patient.collect(timeout=60)), toy.reference_fish("patient"))
    stats = settled(pipeline)["dual_ar"]
    assert stats["restarts"] == 1 and stats["pid"] != pid and stats["state"] == "running" and stats["inflight"] == 0


def test_a_stage_failure_is_not_transient():
    """Only a restart is: a stage that raises fails the request with a plain ``RequestFailed``."""
    broken = Pipeline(toy.fish_like(fail_stage="frontend"), plugin_manager=toy.core_plugins())
    with broken:
        with pytest.raises(RequestFailed) as failed:
            broken.submit({"text": "boom"}, deadline=time.monotonic() + 30).collect(timeout=10)
    assert type(failed.value) is RequestFailed
