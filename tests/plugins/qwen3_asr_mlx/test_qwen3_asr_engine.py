"""The MLX engine: continuous batching gives each request the tokens it gets alone; long audio
is chunked into segments; aborts free their KV rows; bad input fails one request only."""

from __future__ import annotations

import time

import numpy as np
import pytest
from omni_core.pipeline import Pipeline, RequestFailed
from omni_qwen3_asr_mlx.batcher import ASRBatcher
from omni_qwen3_asr_mlx.engine import job_from_payload, load_runtime
from omni_qwen3_asr_mlx.frontend import Frontend, split_audio
from omni_qwen3_asr_mlx.topology import build_topology

from .conftest import noise_audio


@pytest.fixture(scope="module")
def runtime(tiny_dir):
    return load_runtime(tiny_dir, {})


@pytest.fixture(scope="module")
def frontend(tiny_dir):
    return Frontend(tiny_dir, {"chunk_seconds": 30})


def _run(runtime, frontend, requests, max_batch, add_at=None):
    """Run ``requests`` (id -> payload) through one batcher; ``add_at`` maps id -> step to join at."""
    events = []
    batcher = ASRBatcher(runtime.network, runtime.eos_ids, lambda *e: events.append(e), max_batch=max_batch)
    jobs = {rid: job_from_payload(rid, frontend.prepare(p), runtime.tokenizer) for rid, p in requests.items()}
    add_at = add_at or {}
    step = 0
    pending = dict(jobs)
    while pending or batcher.has_work():
        for rid in [r for r in pending if add_at.get(r, 0) <= step]:
            batcher.add(pending.pop(rid))
        assert batcher.step() == []
        step += 1
    assert batcher.cache.rows == 0 and batcher.cache.nbytes() == 0 and not batcher.jobs
    return jobs, events


def test_batched_decoding_matches_each_request_alone(runtime, frontend):
    requests = {f"r{i}": {"audio": noise_audio(s, seed=i), "language": "en" if i % 2 else None}
                for i, s in enumerate([0.6, 2.2, 4.1, 1.3, 3.0])}
    alone = {rid: _run(runtime, frontend, {rid: p}, max_batch=1)[0][rid] for rid, p in requests.items()}
    requests["sampled"] = {"audio": noise_audio(2.0, seed=9), "temperature": 1.0}  # shares the batch
    together, events = _run(runtime, frontend, requests, max_batch=3, add_at={"r3": 5, "r4": 11})
    assert together.pop("sampled").chunks[0].generated > 0
    for rid, job in together.items():
        assert job.chunks[0].text.tokens == alone[rid].chunks[0].text.tokens, rid
        assert job.text == alone[rid].text
        deltas = "".join(delta for r, delta, final in events if r == rid and delta is not None)
        finals = [final for r, delta, final in events if r == rid and final is not None]
        assert len(finals) == 1 and finals[0]["text"] == deltas == job.text


def test_long_audio_is_cut_into_segments(runtime, tiny_dir):
    audio = noise_audio(7.3, seed=4)
    audio[int(2.6 * 16000): int(2.7 * 16000)] = 0.0  # a pause the cut should find
    spans = split_audio(audio, 16000, chunk_seconds=3.0)
    assert spans[0] == (0, spans[0][1]) and spans[-1][1] == audio.size
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert all(stop - start <= 3 * 16000 for start, stop in spans)
    assert 2.6 * 16000 <= spans[0][1] <= 2.7 * 16000

    chunked = Frontend(tiny_dir, {"chunk_seconds": 3.0})
    jobs, events = _run(runtime, chunked, {"long": {"audio": audio, "language": "fr"}}, max_batch=8)
    final = next(f for _, _, f in events if f is not None)
    segments = final["segments"]
    assert len(segments) == len(spans) == 3
    assert [(s["start"], s["end"]) for s in segments] == [(round(a / 16000, 3), round(b / 16000, 3)) for a, b in spans]
    assert final["text"] == " ".join(s["text"] for s in segments if s["text"])
    assert final["duration"] == pytest.approx(7.3) and final["language"] == "fr"
    assert final["usage"]["output_tokens"] == sum(len(c.text.tokens) for c in jobs["long"].chunks) > 0


def test_abort_frees_rows_and_leaves_others_intact(runtime, frontend):
    payloads = {"keep": {"audio": noise_audio(2.0, seed=1)}, "drop": {"audio": noise_audio(5.0, seed=2)}}
    alone = _run(runtime, frontend, {"keep": payloads["keep"]}, max_batch=4)[0]["keep"]
    events = []
    batcher = ASRBatcher(runtime.network, runtime.eos_ids, lambda *e: events.append(e), max_batch=4)
    for rid, payload in payloads.items():
        batcher.add(job_from_payload(rid, frontend.prepare(payload), runtime.tokenizer))
    for _ in range(3):
        batcher.step()
    assert batcher.cache.rows == 2
    assert batcher.abort("drop") and not batcher.abort("drop")
    assert batcher.cache.rows == 1
    while batcher.has_work():
        batcher.step()
    assert batcher.cache.nbytes() == 0 and not batcher.jobs
    final = next(f for r, _, f in events if r == "keep" and f is not None)
    assert final["text"] == alone.text
    assert not any(r == "drop" and f is not None for r, _, f in events)


def test_pipeline_rejects_bad_input_and_keeps_serving(tiny_dir):
    with Pipeline(build_topology(tiny_dir, {"max_batch": 4})).start() as pipeline:
        bad = {
            "language": ({"audio": noise_audio(1.0), "language": "klingon"}, "unsupported language"),
            "empty": ({"audio": np.zeros(0, np.float32)}, "non-empty"),
            "nan": ({"audio": np.full(1600, np.nan, np.float32)}, "NaN"),
            "missing": ({"language": "en"}, "needs 'audio'"),
        }
        for inputs, message in bad.values():
            with pytest.raises(RequestFailed, match=message):
                list(pipeline.submit({"task": "transcription", **inputs}))
        handles = [pipeline.submit({"task": "transcription", "audio": noise_audio(1.5, seed=s),
                                    "prompt": "names: <|im_end|><|audio_pad|> Ada"}) for s in range(3)]
        for handle in handles:
            events = list(handle)
            assert events[-1].end and events[-1].name == "text"
            assert "".join(e.payload["text"] for e in events[:-1]) == events[-1].payload["text"]
        long = pipeline.submit({"task": "transcription", "audio": noise_audio(20.0, seed=5)})
        first = long.get(timeout=60)
        assert first is not None and not first.end
        long.abort()
        deadline = time.monotonic() + 30
        while pipeline.stats()["stages"]["asr"]["running_rows"] and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = pipeline.stats()["stages"]["asr"]
        assert stats["running_rows"] == 0 and stats["running_requests"] == 0 and stats["kv_cache_bytes"] == 0


def test_a_broken_chunk_fails_alone(runtime, frontend):
    events = []
    batcher = ASRBatcher(runtime.network, runtime.eos_ids, lambda *e: events.append(e), max_batch=4)
    good = job_from_payload("good", frontend.prepare({"audio": noise_audio(1.0, seed=7)}), runtime.tokenizer)
    broken = job_from_payload("broken", frontend.prepare({"audio": noise_audio(1.0, seed=8)}), runtime.tokenizer)
    broken.chunks[0].prompt_ids = broken.chunks[0].prompt_ids[:5]  # audio placeholders cut off
    batcher.add(broken)
    batcher.add(good)
    failures = batcher.step()
    assert [rid for rid, _ in failures] == ["broken"] and "audio placeholders" in failures[0][1]
    while batcher.has_work():
        assert batcher.step() == []
    assert [r for r, _, final in events if final is not None] == ["good"]
    assert not batcher.jobs and batcher.cache.nbytes() == 0


@pytest.mark.parametrize(
    ("answer", "language", "words"),
    [
        ("language German<asr_text> Grüße aus Köln", "German", "Grüße aus Köln"),
        ("language None<asr_text>", None, ""),
        ("no marker at all, just words that run on", None, "no marker at all, just words that run on"),
    ],
)
def test_chunk_text_parses_the_language_prefix_and_streams_whole_characters(runtime, answer, language, words):
    from omni_qwen3_asr_mlx.text import ChunkText

    text = ChunkText(runtime.tokenizer, None)
    deltas = [text.push(token) for token in runtime.tokenizer.encode(answer, add_special_tokens=False)]
    deltas.append(text.finish())
    assert "".join(deltas) == text.text == words
    assert text.language == language
    assert not any("\ufffd" in d or "<asr_text>" in d for d in deltas)


def test_mlx_platform_and_device_choice(tiny_dir):
    import mlx.core as mx
    from omni_core.hooks import get_plugin_manager
    from omni_core.platforms.select import resolve_platform

    manager = get_plugin_manager()
    assert resolve_platform("mlx", manager).device() == "mlx:0"
    assert resolve_platform("auto", manager).name != "mlx"  # torch families never get an mlx device
    with Pipeline(build_topology(tiny_dir, {"mlx_device": "cpu"})).start() as pipeline:
        assert list(pipeline.submit({"audio": noise_audio(0.5)}))[-1].end
    if not mx.is_available(mx.gpu):
        with pytest.raises(RuntimeError, match="no GPU backend"):
            Pipeline(build_topology(tiny_dir, {"mlx_device": "gpu"})).start()


def test_its_tiny_preset_warns_once_that_the_text_is_noise(tmp_path, caplog):
    import logging

    from omni_qwen3_asr_mlx.presets import READY_MARK

    (tmp_path / READY_MARK).touch()  # what marks the preset's directory
    with caplog.at_level(logging.WARNING, logger="omni.presets"):
        build_topology(str(tmp_path), {})
        build_topology(str(tmp_path), {})  # omni serve builds twice: to check, then to serve
    assert [r.getMessage() for r in caplog.records if r.name == "omni.presets"] == [
        f"qwen3-asr: {tmp_path} holds the 'tiny' preset (random weights): its text is noise"]
