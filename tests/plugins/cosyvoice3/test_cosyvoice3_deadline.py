"""Deadline order (``--option schedule=deadline``, the default): the flow serves the stream whose listener runs
dry soonest, new requests by their time waiting, on the real flow worker (tiny preset) behind the
real batch executor, with a clock the test sets."""

from __future__ import annotations

import threading
import time

import numpy as np
import torch
from omni_core.hooks import PluginManager
from omni_core.pipeline import Message, StageContext, StageSpec
from omni_cosyvoice3.config import load_config
from omni_cosyvoice3.deadline import DeadlineFlowWorker, StreamClocks, by_deadline
from omni_cosyvoice3.stage_workers import FlowWorker

PROMPT = 10  # prompt tokens: the first chunk is padded to 15 + 25 = 40 tokens (80 mel frames, 1.6 s)
FIRST_CHUNK, NEXT_CHUNK, LOOKAHEAD = 40, 50, 3


def _cond(request_id: str) -> Message:
    payload = {
        "prompt_tokens": list(range(PROMPT)),
        "prompt_mel": torch.zeros(2 * PROMPT, 80),
        "embedding": torch.ones(192),
        "streaming": True,
        "speed": 1.0,
        "input_tokens": 4,
    }
    return Message(request_id, "cond", payload, True, 0)


def _tokens(request_id: str, count: int, seq: int) -> Message:
    return Message(request_id, "tokens", {"token_ids": [7] * count}, False, seq)


def _worker(flow, tiny_dir, clock) -> DeadlineFlowWorker:
    return DeadlineFlowWorker(flow, load_config(tiny_dir).chunk_size, 100, mel_seconds=0.02, clock=clock)


def _with_first_chunks(worker, now, started: dict[str, float]) -> None:
    """Each stream's conditioning and first chunk, produced at its own time."""
    for request_id, at in started.items():
        now[0] = at
        worker.process([_cond(request_id)], lambda *a, **k: None)
        worker.process([_tokens(request_id, FIRST_CHUNK + LOOKAHEAD, 1)], lambda *a, **k: None)


def test_the_stream_closest_to_running_dry_goes_first_and_new_requests_by_their_wait(flow, tiny_dir):
    now = [0.0]
    worker = _worker(flow, tiny_dir, lambda: now[0])
    _with_first_chunks(worker, now, {"a": 0.0, "b": 0.5, "c": 1.0})  # 1.6 s each
    worker.process([_cond("d")], lambda *a, **k: None)  # seen at 1.0, nothing produced yet
    now[0] = 1.2  # a has 0.4 s left, b 0.9 s, c 1.4 s; d has waited 0.2 s
    heads = [_tokens(r, NEXT_CHUNK, 2) for r in "cba"] + [_tokens("d", FIRST_CHUNK + LOOKAHEAD, 1)]
    assert abs(worker.clocks.slack("a", 1.2) - 0.4) < 1e-9 and abs(worker.clocks.slack("d", 1.2) + 0.2) < 1e-9
    assert [m.request_id for m in worker.choose(heads)] == ["d", "a", "b", "c"]
    # tokens that complete no chunk and a new request's conditioning cost nothing: they go first,
    # so a batch cut at max_batch never leaves a new request out
    cheap = [_tokens("a", 5, 2), _cond("e")]
    assert [m.request_id for m in worker.choose([heads[1], *cheap])] == ["a", "e", "b"]


def test_a_stream_past_the_work_budget_waits_unless_it_is_the_first():
    clocks = StreamClocks(lambda: 10.0)
    clocks.seen("new", 9.0)
    for request_id, produced_at in (("soon", 8.0), ("later", 9.5)):
        clocks.clock = lambda at=produced_at: at
        clocks.produced(request_id, 2.5)  # runs dry at 10.5 and 12.0
    clocks.clock = lambda: 10.0
    heads = [Message(r, "tokens", {}, False, 1) for r in ("later", "soon", "new")]
    frames = {"new": 400, "soon": 600, "later": 100}
    fits = lambda batch, longest: batch * longest <= 1000  # noqa: E731 - rows padded to the longest
    # new (slack -1.0) runs; soon (0.5) would make 2 x 600 frames; later (2.0) makes 2 x 400
    order = by_deadline(clocks, heads, lambda m: frames[m.request_id], fits)
    assert [m.request_id for m in order] == ["new", "later"]
    # a first stream past the budget alone still runs
    assert [m.request_id for m in by_deadline(clocks, heads[:1], lambda m: 5000, fits)] == ["later"]


def test_a_stream_on_the_flow_cache_counts_only_its_new_frames(flow, tiny_dir):
    """The work budget weighs what a call computes: a stream whose finished frames the cache holds
    counts its new frames alone, unless its call will not run on the cache (a full last call)."""
    from omni_cosyvoice3.flow_cache import FlowCache

    def served(masked_last: bool) -> DeadlineFlowWorker:
        cache = FlowCache(flow.cfg, 1 << 30, "cpu", flow.dtype)
        worker = DeadlineFlowWorker(
            flow, load_config(tiny_dir).chunk_size, 100, cache, masked_last=masked_last, mel_seconds=0.02
        )
        _with_first_chunks(worker, [0.0], {"a": 0.0})
        assert cache.cached_frames("a") == 2 * (PROMPT + FIRST_CHUNK)
        return worker

    ahead = FIRST_CHUNK + LOOKAHEAD + NEXT_CHUNK  # tokens once the next chunk is due
    worker = served(masked_last=False)
    nxt = Message("a", "tokens", {"token_ids": [7] * NEXT_CHUNK}, False, 2)
    assert worker._frames_after(nxt) == 2 * NEXT_CHUNK
    last = Message("a", "tokens", {"token_ids": [7] * NEXT_CHUNK}, True, 2)
    assert worker._frames_after(last) == 2 * (PROMPT + ahead)  # the full last call recomputes all
    assert served(masked_last=True)._frames_after(last) == 2 * (PROMPT + ahead) - 2 * (PROMPT + FIRST_CHUNK)
    uncached = _worker(flow, tiny_dir, lambda: 0.0)
    _with_first_chunks(uncached, [0.0], {"a": 0.0})
    assert uncached._frames_after(nxt) == 2 * (PROMPT + FIRST_CHUNK + NEXT_CHUNK)


def test_a_hift_stream_counts_its_window_and_its_chunk_as_stretched(hift):
    """HiFT's work for a stream: the frames its window keeps plus the new chunk, as the worker
    will stretch it for the request's speed."""
    from omni_cosyvoice3.deadline import DeadlineHiftWorker

    worker = DeadlineHiftWorker(hift, sample_rate=24000)
    worker.process([Message("a", "mel", {"mel": torch.zeros(80, 100)}, False, 0)], lambda *a, **k: None)
    kept = worker.streams["a"].mel.shape[1]
    assert kept < 100  # a window's reach, not the whole mel
    chunk = torch.zeros(80, 60)
    assert worker._frames_after(Message("a", "mel", {"mel": chunk}, False, 1)) == kept + 60
    assert worker._frames_after(Message("a", "mel", {"mel": chunk, "speed": 0.5}, False, 1)) == kept + 120
    assert worker._frames_after(Message("a", "mel", {"mel": torch.zeros(80, 0)}, False, 1)) is None


class _Recorder:
    def __init__(self):
        self.emitted: list[Message] = []
        self.lock = threading.Lock()

    def emit(self, message):
        with self.lock:
            self.emitted.append(message)


def _run_queued(worker, messages: list[Message]) -> list[str]:
    """The order in which the batch executor (one request a batch) runs the queued messages."""
    recorder = _Recorder()
    stage = StageSpec("flow", "batch", lambda context: worker, options={"max_batch": 1, "batch_window_ms": 0})
    context = StageContext("flow", "cpu", recorder.emit, lambda rid, error: None, options=dict(stage.options))
    executor = PluginManager(selection=set()).engine("batch").build(stage, context)
    for message in messages:
        executor.submit(message)  # queued before the worker thread starts: all wait together
    executor.start()
    deadline = time.monotonic() + 60
    while len(recorder.emitted) < len(messages) and time.monotonic() < deadline:
        time.sleep(0.01)
    executor.stop()
    return [m.request_id for m in recorder.emitted]


def test_the_executor_runs_the_queue_in_deadline_order_not_arrival_order(flow, tiny_dir):
    now = [0.0]
    worker = _worker(flow, tiny_dir, lambda: now[0])
    _with_first_chunks(worker, now, {"a": 0.0, "b": 0.5, "c": 1.0})
    worker.process([_cond("d")], lambda *a, **k: None)
    now[0] = 1.2  # the clock stands still: d, once served, has 1.6 s left and goes last
    queued = [_tokens(r, NEXT_CHUNK, 2) for r in "cba"] + [_tokens("d", FIRST_CHUNK + LOOKAHEAD, 1)]
    assert _run_queued(worker, queued) == ["d", "a", "b", "c"]
    # the same queue on the arrival-order worker runs as it came
    arrival = FlowWorker(flow, load_config(tiny_dir).chunk_size, 100)
    _with_first_chunks(arrival, now, {"a": 0.0, "b": 0.5, "c": 1.0})
    arrival.process([_cond("d")], lambda *a, **k: None)
    assert _run_queued(arrival, queued) == ["c", "b", "a", "d"]


def _speak_together(pipeline, seeds: list[int]) -> dict[int, np.ndarray]:
    """Several streamed requests at once; each one's audio."""
    from tests.plugins.cosyvoice3.test_cosyvoice3_pipeline import _inputs

    audio: dict[int, np.ndarray] = {}

    def one(seed: int) -> None:
        events = pipeline.submit(_inputs("Deadlines order the work, not the words.", seed))
        audio[seed] = np.concatenate(
            [np.asarray(e.payload["audio"]) for e in events if e.name == "audio" and "audio" in e.payload]
        )

    threads = [threading.Thread(target=one, args=(seed,)) for seed in seeds]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return audio


def test_deadline_order_keeps_every_requests_audio(tiny_dir):
    """The order of the work changes, not its result: three concurrent replies of several chunks
    each sound the same under deadline order as under arrival order; nothing is left behind."""
    from omni_core.hooks import get_plugin_manager
    from omni_core.pipeline import Pipeline
    from omni_cosyvoice3.topology import build

    manager = get_plugin_manager()
    options = {"min_token_text_ratio": 5, "max_token_text_ratio": 6, "min_length_blocks": "all"}
    with Pipeline(build(tiny_dir, {**options, "schedule": "arrival"}), device="cpu", plugin_manager=manager) as arrival:
        assert not isinstance(arrival.executors["flow"].worker, DeadlineFlowWorker)
        expected = _speak_together(arrival, [1, 2, 3])
    with Pipeline(build(tiny_dir, options), device="cpu", plugin_manager=manager) as deadline:  # the default
        assert isinstance(deadline.executors["flow"].worker, DeadlineFlowWorker)
        got = _speak_together(deadline, [1, 2, 3])
        flow = deadline.executors["flow"].worker
        assert not flow.streams and not flow.clocks.buffers and not flow.clocks.first_seen
    for seed in (1, 2, 3):
        assert len(got[seed]) == len(expected[seed]) > 0
        np.testing.assert_allclose(got[seed], expected[seed], atol=1e-4)
