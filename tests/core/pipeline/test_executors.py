"""The fn and batch executors on their own, built through the plugin manager: bounded queues,
a failing batch that fails only its culprit, one message per request per batch, release (on the
worker thread, after a call that still holds the request)."""

from __future__ import annotations

import threading
import time

import torch
from omni_core.pipeline import Message, StageContext, StageSpec

from tests.core.pipeline import toy_topologies as toy


class Recorder:
    def __init__(self):
        self.emitted: list[Message] = []
        self.failed: dict[str, str] = {}
        self.lock = threading.Lock()

    def emit(self, message):
        with self.lock:
            self.emitted.append(message)

    def fail(self, request_id, error):
        with self.lock:
            self.failed[request_id] = error


def build(engine, factory, recorder, **options):
    stage = StageSpec("s", engine, factory, options=options)
    context = StageContext("s", "cpu", recorder.emit, recorder.fail, options=dict(options))
    executor = toy.core_plugins().engine(engine).build(stage, context)
    executor.start()
    return executor


class Doubler:
    """Batched: doubles each message's tensor; raises for a message marked bad."""

    def __init__(self, context):
        self.batches: list[list[str]] = []
        self.released: list[str] = []

    def process(self, messages, emit):
        self.batches.append([m.request_id for m in messages])
        for m in messages:
            if m.payload.get("bad"):
                raise ValueError(f"bad input in {m.request_id}")
            emit(m.request_id, "out", {"x": m.payload["x"] * 2}, end=m.end)

    def release(self, request_id):
        self.released.append(request_id)


def wait_until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.005)
    return predicate()


def test_batch_failure_fails_only_the_culprit_and_nothing_is_emitted_twice():
    recorder = Recorder()
    executor = build("batch", Doubler, recorder, batch_window_ms=50, max_batch=8)
    try:
        for i in range(4):
            executor.submit(Message(f"r{i}", "in", {"x": torch.tensor([i]), "bad": i == 2}))
        assert wait_until(lambda: len(recorder.emitted) == 3 and "r2" in recorder.failed)
        assert executor.worker.batches[0] == ["r0", "r1", "r2", "r3"]  # grouped in one window
        assert sorted(m.request_id for m in recorder.emitted) == ["r0", "r1", "r3"]
        assert {m.request_id: int(m.payload["x"]) for m in recorder.emitted} == {"r0": 0, "r1": 2, "r3": 6}
        assert recorder.failed["r2"].startswith("ValueError: bad input in r2 (at ")
        executor.release("r0")
        assert wait_until(lambda: executor.worker.released == ["r0"])
    finally:
        executor.stop()


def test_a_batch_holds_one_chunk_per_request_in_order():
    recorder = Recorder()
    executor = build("batch", Doubler, recorder, batch_window_ms=30, max_batch=8)
    try:
        for seq in range(3):
            executor.submit(Message("a", "in", {"x": torch.tensor([seq])}, end=seq == 2, seq=seq))
        executor.submit(Message("b", "in", {"x": torch.tensor([9])}))
        assert wait_until(lambda: len(recorder.emitted) == 4)
        assert all(len(set(batch)) == len(batch) for batch in executor.worker.batches)
        chunks = [m for m in recorder.emitted if m.request_id == "a"]
        assert [int(m.payload["x"]) for m in chunks] == [0, 2, 4] and [m.seq for m in chunks] == [0, 1, 2]
        assert chunks[-1].end and not chunks[0].end
    finally:
        executor.stop()


class Picky(Doubler):
    """Doubler whose ``choose`` takes the requests named in a message's ``rank`` (lowest first),
    never a request ranked None, and returns a message that is not a request's oldest."""

    def __init__(self, context):
        super().__init__(context)
        self.offered: list[list[str]] = []

    def choose(self, heads):
        self.offered.append([m.request_id for m in heads])
        ranked = sorted((m for m in heads if m.payload["rank"] is not None), key=lambda m: m.payload["rank"])
        stale = Message("zz", "in", {"x": torch.tensor([0])})
        return [stale, *ranked]


def test_a_worker_that_chooses_orders_the_requests_and_the_oldest_runs_if_it_picks_none():
    recorder = Recorder()
    options = {"batch_window_ms": 0, "max_batch": 2}
    stage = StageSpec("s", "batch", Picky, options=options)
    executor = toy.core_plugins().engine("batch").build(stage, StageContext("s", "cpu", recorder.emit, recorder.fail, options=options))
    for rid, rank in (("a", 3), ("b", 1), ("c", None), ("d", 2)):
        executor.submit(Message(rid, "in", {"x": torch.tensor([1]), "rank": rank}))
        executor.submit(Message(rid, "in", {"x": torch.tensor([2]), "rank": 0}, seq=1))
    executor.start()  # everything queued before the first choice
    try:
        assert wait_until(lambda: len(recorder.emitted) == 8)
        batches = executor.worker.batches
        # only each request's oldest is offered; at most max_batch run, the chosen order kept
        assert all(len(set(o)) == len(o) for o in executor.worker.offered)
        assert all(len(b) <= 2 for b in batches)
        assert sum(batches, []).count("c") == 2  # never chosen alone: run as the oldest left
        order = [m.request_id for m in recorder.emitted if int(m.payload["x"]) == 2]
        assert order[:3] == ["b", "d", "a"]
    finally:
        executor.stop()


class BrokenChooser(Doubler):
    def choose(self, heads):
        raise KeyError("no clock for this request")


def test_a_choose_that_raises_falls_back_to_arrival_order_and_the_stage_keeps_serving():
    recorder = Recorder()
    executor = build("batch", BrokenChooser, recorder, batch_window_ms=0, max_batch=4)
    try:
        for rid in ("a", "b", "c"):
            executor.submit(Message(rid, "in", {"x": torch.tensor([1])}))
        assert wait_until(lambda: len(recorder.emitted) == 3)
        assert sorted(m.request_id for m in recorder.emitted) == ["a", "b", "c"] and not recorder.failed
    finally:
        executor.stop()


class SlowCache:
    """Batched: keeps a per-request cache written back when ``process`` returns (as a vocoder's
    sent-sample counts are), so a release that ran during the call would be undone."""

    def __init__(self, context):
        self.cache: dict[str, int] = {}
        self.inside = threading.Event()
        self.gate = threading.Event()

    def process(self, messages, emit):
        cache = dict(self.cache)
        for m in messages:
            cache[m.request_id] = cache.get(m.request_id, 0) + 1
        self.inside.set()
        self.gate.wait(10)
        self.cache = cache
        for m in messages:
            emit(m.request_id, "out", {}, end=m.end)

    def release(self, request_id):
        self.cache.pop(request_id, None)


def test_an_abort_during_a_call_frees_the_state_that_call_writes_back():
    recorder = Recorder()
    executor = build("batch", SlowCache, recorder, batch_window_ms=1)
    worker = executor.worker
    try:
        executor.submit(Message("kept", "in", {}, end=False))
        executor.submit(Message("aborted", "in", {}, end=False))
        assert worker.inside.wait(5)
        executor.abort("aborted")  # while the call that counts its chunk still runs
        worker.gate.set()
        assert wait_until(lambda: "aborted" not in worker.cache and executor.stats()["busy"] == 0)
        assert worker.cache == {"kept": 1}
        assert [m.request_id for m in recorder.emitted] == ["kept"]  # nothing sent for the aborted one
    finally:
        worker.gate.set()
        executor.stop()


def test_a_full_queue_makes_the_producer_wait_instead_of_growing():
    gate = threading.Event()

    def blocked_factory(context):
        def run(message, emit):
            gate.wait(10)
            emit("out", {"n": message.payload["n"]})

        return run

    recorder = Recorder()
    executor = build("fn", blocked_factory, recorder, max_queue=2)
    produced = []

    def producer():
        for n in range(6):
            executor.submit(Message(f"r{n}", "in", {"n": n}))
            produced.append(n)

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    try:
        assert wait_until(lambda: len(produced) == 3)  # one in the worker, two queued
        time.sleep(0.2)
        assert len(produced) == 3 and executor.stats()["queue_depth"] == 2 and thread.is_alive()
        gate.set()
        thread.join(5)
        assert wait_until(lambda: len(recorder.emitted) == 6)
        assert [m.payload["n"] for m in recorder.emitted] == list(range(6))
    finally:
        gate.set()
        executor.stop()
