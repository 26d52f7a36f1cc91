"""The `ar` stage executor through a real StageSpec / StageContext, and the asyncio streaming API."""

import asyncio
import functools
import threading
import time

import pytest
import torch
from omni_core.hooks import get_plugin_manager
from omni_core.pipeline.topology import StageSpec
from omni_core.scheduler import (
    AREngine,
    ARStageWorker,
    AsyncAREngine,
    EngineConfig,
    EngineRequest,
    SamplingParams,
)
from omni_core.scheduler.executor import Message, StageContext

from .conftest import ShiftedLM


class Collector:
    def __init__(self):
        self.messages, self.failures = [], []
        self.lock = threading.Lock()

    def emit(self, message):
        with self.lock:
            self.messages.append(message)

    def fail(self, request_id, error):
        with self.lock:
            self.failures.append((request_id, error))

    def wait(self, predicate, timeout=20.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if predicate(self):
                    return True
            time.sleep(0.01)
        return False

    def ended(self, request_id):
        return any(m.request_id == request_id and m.end for m in self.messages)

    def tokens(self, request_id):
        return [t for m in self.messages if m.request_id == request_id for t in m.payload["token_ids"]]


def start_executor(factory, collector, device: str = "cpu"):
    """The `ar` engine as the runtime gets it: through the core's entry point."""
    stage = StageSpec("llm", "ar", factory)
    context = StageContext("llm", device, collector.emit, collector.fail)
    executor = get_plugin_manager().engine("ar").build(stage, context)
    executor.start()
    return executor


class KeepingWorker(ARStageWorker):
    """Keeps per-request state from make_request until the last output or a release."""

    def __init__(self, model, engine_config):
        super().__init__(model, engine_config=engine_config)
        self.kept: set[str] = set()
        self.released: list[str] = []

    def make_request(self, message):
        request = super().make_request(message)
        self.kept.add(message.request_id)
        return request

    def on_output(self, request_id, new_token_ids, finished, step_outputs, emit):
        super().on_output(request_id, new_token_ids, finished, step_outputs, emit)
        if finished:
            self.kept.discard(request_id)

    def release(self, request_id):
        self.released.append(request_id)
        self.kept.discard(request_id)


def test_stage_streams_tokens_fails_bad_requests_alone_and_aborts(tiny_model):
    collector = Collector()

    def factory(context):
        return KeepingWorker(tiny_model, EngineConfig(block_size=4, num_kv_blocks=64))

    executor = start_executor(factory, collector)
    try:
        expected = AREngine(tiny_model, EngineConfig(block_size=4, num_kv_blocks=64)).generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0].token_ids
        executor.submit(Message("long", "in", {"prompt_token_ids": [9, 9, 9], "sampling": {"max_tokens": 200, "seed": 1, "ignore_eos": True}}))
        executor.submit(Message("good", "in", {"prompt_token_ids": [1, 2, 3], "sampling": {"temperature": 0, "max_tokens": 6, "ignore_eos": True}}))
        executor.submit(Message("typo", "in", {"prompt_token_ids": [1], "sampling": {"temprature": 0.5}}))
        executor.submit(Message("oov", "in", {"prompt_token_ids": [1, 10_000]}))
        assert collector.wait(lambda c: c.ended("good") and len(c.failures) == 2)
        assert collector.tokens("good") == expected
        chunks = [m for m in collector.messages if m.request_id == "good"]
        assert [m.seq for m in chunks] == list(range(6)) and [m.end for m in chunks] == [False] * 5 + [True]
        assert {r for r, _ in collector.failures} == {"typo", "oov"}
        assert "temprature" in dict(collector.failures)["typo"]
        assert dict(collector.failures)["oov"].startswith("InvalidInput: prompt token ids must be in")
        executor.abort("long")
        assert collector.wait(lambda c: executor.stats().get("kv_blocks_free") == 64 and executor.stats().get("running") == 0)
        n = len(collector.tokens("long"))
        time.sleep(0.1)
        assert len(collector.tokens("long")) == n and not collector.ended("long")
        # the engine refused "oov" after make_request kept its state; "long" was aborted; "good" finished
        assert not executor.worker.kept
        assert sorted(executor.worker.released) == ["long", "oov", "typo"]
    finally:
        executor.stop()


def test_stage_with_custom_request_and_per_request_extras(tiny_model):
    """A family's make_request/on_output, and extras the model reads per sequence (the way a
    family keeps per-request encoder state): the batch gives each request its own result."""

    model = ShiftedLM(tiny_model)
    shifts = {f"r{i}": torch.randn(1, 64) * 0.5 for i in range(3)}

    def make_request(message):
        rid = message.request_id
        return EngineRequest(rid, prompt_token_ids=message.payload["ids"], params=SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), extras={"shift": shifts[rid]})

    def on_output(request_id, new_ids, finished, step_outputs, emit):
        emit("speech_tokens", {"token_ids": new_ids}, end=finished)

    collector = Collector()
    executor = start_executor(lambda ctx: ARStageWorker(model, engine_config=EngineConfig(block_size=4, num_kv_blocks=64), make_request=make_request, on_output=on_output), collector)
    try:
        for i in range(3):
            executor.submit(Message(f"r{i}", "in", {"ids": [3, 1, 4, 1, 5][: 3 + i]}))
        assert collector.wait(lambda c: all(c.ended(f"r{i}") for i in range(3)))
    finally:
        executor.stop()
    assert {m.port for m in collector.messages} == {"speech_tokens"}
    for i in range(3):
        solo = AREngine(model, EngineConfig(block_size=4, num_kv_blocks=64))
        solo.add_request(make_request(Message(f"r{i}", "in", {"ids": [3, 1, 4, 1, 5][: 3 + i]})))
        ref = []
        while solo.has_unfinished():
            ref += [t for o in solo.step() for t in o.new_token_ids]
        assert collector.tokens(f"r{i}") == ref


@pytest.mark.parametrize("overlap", [False, True], ids=["step-by-step", "overlapped"])
def test_async_stream_and_early_exit_frees_blocks(tiny_model, overlap):
    # overlapped: the loop thread applies adds and aborts while a decode step may be in flight
    step_by_step = AREngine(tiny_model, EngineConfig(block_size=4, num_kv_blocks=64, overlap_decode=False))
    expected = step_by_step.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0].token_ids
    engine = AREngine(tiny_model, EngineConfig(block_size=4, num_kv_blocks=64, overlap_decode=overlap))
    aengine = AsyncAREngine(engine)

    async def main():
        streamed = []
        async for out in aengine.stream([5, 6, 7], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)):
            streamed.append(out.new_token_ids)
        together = await asyncio.gather(*(aengine.generate([5, 6, 7], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)) for _ in range(3)))
        async for _ in aengine.stream([1, 2], SamplingParams(max_tokens=100, ignore_eos=True)):
            break  # leaving early aborts
        return streamed, together

    try:
        streamed, together = asyncio.run(main())
        assert streamed == [[t] for t in expected]
        assert all(g.token_ids == expected for g in together)
        deadline = time.monotonic() + 10
        while engine.has_unfinished() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert aengine.loop.stats["kv_blocks_free"] == 64
    finally:
        aengine.shutdown()


def test_hooks_come_from_a_plugin_when_the_worker_has_none(tiny_model):
    from types import SimpleNamespace

    from omni_core.hooks import PluginManager, hookimpl
    from omni_core.scheduler import ARHooks

    class AlwaysSeven(ARHooks):
        def sample(self, batch, logits):
            return torch.full((logits.shape[0],), 7, dtype=torch.int64)

    seen = []

    @hookimpl
    def omni_stage_hooks(family, stage, options):
        seen.append((family, stage))
        return AlwaysSeven() if family == "fam" else None

    manager = PluginManager(entry_points=[], selection=None)
    manager.register_object("hooks-provider", SimpleNamespace(omni_stage_hooks=omni_stage_hooks))
    collector = Collector()
    stage = StageSpec("llm", "ar", lambda ctx: ARStageWorker(tiny_model, engine_config=EngineConfig(block_size=4, num_kv_blocks=32)), options={"family": "fam"})
    context = StageContext("llm", "cpu", collector.emit, collector.fail, options={"family": "fam"}, plugin_manager=manager)
    executor = get_plugin_manager().engine("ar").build(stage, context)
    executor.start()
    try:
        executor.submit(Message("r", "in", {"prompt_token_ids": [1, 2], "sampling": {"max_tokens": 3, "ignore_eos": True}}))
        assert collector.wait(lambda c: c.ended("r"))
    finally:
        executor.stop()
    assert seen == [("fam", "llm")] and collector.tokens("r") == [7, 7, 7]


class _SamplesSeven:
    def sample(self, batch, logits):
        return torch.full((logits.shape[0],), 7, dtype=torch.int64)


class _FamilyWorker(ARStageWorker):
    """A family's AR stage that brings its own hooks (module-level: stage factories pickle)."""

    def __init__(self, model, context):
        super().__init__(model, hooks=_SamplesSeven(), engine_config=EngineConfig(block_size=4, num_kv_blocks=32))


def test_another_plugins_stage_hooks_wrap_the_familys_with_both_names(tiny_model):
    """Two plugins: a family whose AR stage passes its own hooks, and one whose omni_stage_hooks
    wraps them. Through a real pipeline the wrapper is asked with the family's and the stage's
    names and the family's hooks, and the tokens are the wrapped ones (7 + 1)."""
    from types import SimpleNamespace

    from omni_core.hooks import PluginManager, hookimpl
    from omni_core.pipeline import Pipeline, StageSpec, Topology

    asked = []

    class PlusOne:
        def __init__(self, inner):
            self.inner = inner

        def sample(self, batch, logits):
            return self.inner.sample(batch, logits) + 1

    @hookimpl
    def omni_stage_hooks(family, stage, hooks):
        asked.append((family, stage, type(hooks).__name__))
        return PlusOne(hooks)

    manager = PluginManager(selection=set())
    manager.register_object("wrapper", SimpleNamespace(omni_stage_hooks=omni_stage_hooks))
    topology = Topology([StageSpec("llm", "ar", functools.partial(_FamilyWorker, tiny_model), ("in",), ("tokens",))], [],
                        "llm.in", {"tokens": "llm.tokens"}, name="fam")
    with Pipeline(topology, plugin_manager=manager) as pipeline:
        events = pipeline.submit({"prompt_token_ids": [1, 2], "sampling": {"max_tokens": 3, "ignore_eos": True}}).collect(timeout=30)
    assert asked == [("fam", "llm", "_SamplesSeven")]
    assert [t for event in events["tokens"] for t in event.payload.get("token_ids", [])] == [8, 8, 8]
