"""The topology on the real pipeline runtime, in process: aborts and failures leave no state
behind in any stage (flow streams and cached chunks, vocoder caches, held tokens, KV blocks),
and the flow's cache of finished chunks keeps the audio."""

from __future__ import annotations

import functools
import time

import numpy as np
import pytest
from omni_core.hooks import get_plugin_manager
from omni_core.pipeline import Pipeline, RequestFailed
from omni_cosyvoice3.topology import build


def _inputs(text: str, seed: int, **extra) -> dict:
    base = {
        "task": "speech",
        "text": text,
        "voice": "default",
        "instructions": None,
        "speed": 1.0,
        "seed": seed,
        "sampling": {},
        "reference_audio": None,
        "reference_sample_rate": None,
        "reference_text": None,
    }
    return {**base, **extra}


def _idle(pipeline: Pipeline) -> bool:
    flow = pipeline.executors["flow"].worker
    hift = pipeline.executors["hift"].worker
    llm = pipeline.executors["llm"]
    blocks = llm.engine.block_manager
    return (
        not flow.streams
        and not flow.early
        and (flow.cache is None or (not flow.cache.requests and flow.cache.bytes_in_use() == 0))
        and not hift.streams
        and not llm.worker.ras_hooks.held
        and not llm.engine.requests
        and all(b.ref_count == 0 for b in blocks.blocks)
    )


def test_abort_and_failures_free_every_stage(tiny_dir):
    pipeline = Pipeline(
        build(tiny_dir, {"max_batch": 8, "flow_cache_bytes": 1 << 26}),
        device="cpu",
        plugin_manager=get_plugin_manager(),
    ).start()
    try:
        long_text = "This request is long enough that it will still be speaking when it is aborted. " * 3
        aborted = pipeline.submit(_inputs(long_text, 1, sampling={"temperature": 1.0}))
        kept = pipeline.submit(_inputs("A short line that finishes.", 2))
        first = aborted.get(timeout=60)
        assert first is not None and first.name == "audio"
        aborted.abort()
        audio = [np.asarray(e.payload["audio"]) for e in kept if e.name == "audio" and "audio" in e.payload]
        assert sum(len(a) for a in audio) > 0

        bad = pipeline.submit(
            _inputs("Hi", 3, reference_audio=np.zeros(100, dtype=np.float32), reference_sample_rate=16000)
        )
        with pytest.raises(RequestFailed, match="InvalidInput: reference audio must last"):
            list(bad)
        bad_sampling = pipeline.submit(_inputs("Hi", 4, sampling={"top_k": 0}))
        with pytest.raises(RequestFailed, match="InvalidInput: top_k"):
            list(bad_sampling)
        too_long = pipeline.submit(_inputs("Far too many words to fit. " * 60, 5))  # fails when the llm adds it
        with pytest.raises(RequestFailed, match="InvalidInput: prompt .* exceeds the engine's max_model_len"):
            list(too_long)

        deadline = time.monotonic() + 30
        while not _idle(pipeline):
            assert time.monotonic() < deadline, "a stage kept state of a finished, aborted or failed request"
            time.sleep(0.1)
    finally:
        pipeline.shutdown()


def _speak(pipeline: Pipeline, seed: int) -> np.ndarray:
    events = pipeline.submit(_inputs("Placement is configuration, not code.", seed))
    return np.concatenate(
        [np.asarray(e.payload["audio"]) for e in events if e.name == "audio" and "audio" in e.payload]
    )


def test_stages_in_processes_give_the_same_audio(tiny_dir):
    rebuild = functools.partial(build, tiny_dir, {})
    manager = get_plugin_manager()
    with Pipeline(rebuild(), device="cpu", plugin_manager=manager) as inproc:
        expected = _speak(inproc, 5)
    with Pipeline(
        rebuild(), stage_mode="process", device="cpu", plugin_manager=manager, rebuild=rebuild
    ) as spawned:
        got = _speak(spawned, 5)
    assert len(got) == len(expected) > 0
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_the_flow_cache_keeps_the_audio(tiny_dir):
    """A streamed request's audio with the flow computing only new chunks' frames equals its audio
    with every flow call over all the frames (a reply of three chunks: 5-6 speech tokens a text token)."""
    manager = get_plugin_manager()
    options = {"min_token_text_ratio": 5, "max_token_text_ratio": 6, "min_length_blocks": "all"}
    with Pipeline(build(tiny_dir, options), device="cpu", plugin_manager=manager) as plain:
        expected = _speak(plain, 7)
    cache = {**options, "flow_cache_bytes": 1 << 26}
    with Pipeline(build(tiny_dir, cache), device="cpu", plugin_manager=manager) as cached:
        got = _speak(cached, 7)
        assert cached.executors["flow"].worker.cache.bytes_in_use() == 0
    assert len(got) == len(expected) > 0
    np.testing.assert_allclose(got, expected, atol=1e-4)
