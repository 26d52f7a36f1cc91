"""One voice across a long text's segments: a later segment's prompt carries the earlier
segments' turns (their text and the codes they generated), as the reference's long-text
generation does, on the stage's worker and the core engine with greedy sampling."""

from __future__ import annotations

import numpy as np
import torch
from omni_core.scheduler.engine import AREngine, EngineConfig, EngineRequest
from omni_core.scheduler.executor import Message
from omni_fish_s2pro.checkpoint import load_fast_ar, load_slow_ar
from omni_fish_s2pro.codec_checkpoint import load_codec
from omni_fish_s2pro.config import load_config, load_tokenizer, token_ids
from omni_fish_s2pro.dual_ar_stage import DualARWorker
from omni_fish_s2pro.frontend import Frontend, FrontendWorker
from omni_fish_s2pro.segment_context import SpokenTurn, with_context

TEXTS = ["The first sentence of a long text.", "The second one follows.", "And a third ends it."]
GREEDY = {"temperature": 0.0}


def _worker(tiny_dir, segment_context=2, max_new_tokens=10, **engine):
    cfg = load_config(tiny_dir)
    worker = DualARWorker(
        load_slow_ar(tiny_dir),
        load_fast_ar(tiny_dir),
        token_ids(tiny_dir, cfg.codebook_size),
        EngineConfig(block_size=4, **engine),
        max_new_tokens,
        segment_context=segment_context,
    )
    worker.engine = AREngine(worker.model, worker.engine_config, hooks=worker.hooks)
    worker.max_model_len = worker.engine.max_model_len
    return worker


def _prompts(tiny_dir) -> list[dict]:
    """The frontend's ``prompt`` messages of the segments of one request, as it emits them."""
    cfg = load_config(tiny_dir)
    frontend = FrontendWorker(
        Frontend(load_tokenizer(tiny_dir), token_ids(tiny_dir, cfg.codebook_size), load_codec(tiny_dir))
    )
    out = []
    for i, text in enumerate(TEXTS):
        segment = {"group": "long", "index": i, "count": len(TEXTS)}
        payload = {"text": text, "seed": 3 + i, "sampling": GREEDY, "segment": segment}
        frontend(Message(f"long.{i}", "in", payload, True, 0), lambda port, p, out=out: out.append(p))
    return out


def _speak(worker, request: EngineRequest) -> torch.Tensor:
    """The voiced frames [n, num_codebooks] of one request run to its end."""
    frames: list[torch.Tensor] = []
    worker.engine.add_request(request)
    while worker.engine.has_unfinished():
        for out in worker.engine.step():
            worker.on_output(
                out.request_id, out.new_token_ids, out.finished, out.step_outputs,
                lambda port, payload, end=False: frames.append(payload["codes"]),
            )  # fmt: skip
    return torch.cat(frames)


def _request(worker, rid: str, payload: dict) -> EngineRequest:
    return worker.make_request(Message(rid, "in", payload, True, 0))


def test_a_later_segment_prompt_carries_the_earlier_segment_codes(tiny_dir):
    worker = _worker(tiny_dir)
    ids = worker.ids
    first, second, _ = _prompts(tiny_dir)
    spoken = _speak(worker, _request(worker, "long.0", first))
    assert spoken.shape[0] > 0

    request = _request(worker, "long.1", second)
    start = second["turn_start"]
    expected = (
        second["token_ids"][:start]
        + first["token_ids"][first["turn_start"] :]  # the first segment's user turn, then its voice
        + [ids.semantic_begin + int(c) for c in spoken[:, 0]]
        + list(ids.turn_end)
        + second["token_ids"][start:]
    )
    assert request.extras["fish"].prompt_ids == expected

    # greedy: the segment speaks as a lone request whose prompt is that chat, the codes its frames
    carried = _speak(worker, request)
    plain = {"token_ids": expected, "frames": spoken.T, "seed": 4, "sampling": GREEDY}
    fresh = _worker(tiny_dir)
    assert torch.equal(_speak(fresh, _request(fresh, "plain", plain)), carried)
    alone = {**second, "segment": None}
    assert not torch.equal(_speak(fresh, _request(fresh, "alone", alone))[:4], carried[:4])


def test_the_context_keeps_the_latest_segments_and_is_dropped_with_the_request(tiny_dir):
    worker = _worker(tiny_dir, segment_context=1)
    prompts = _prompts(tiny_dir)
    spoken = [_speak(worker, _request(worker, "long.0", prompts[0]))]
    spoken.append(_speak(worker, _request(worker, "long.1", prompts[1])))
    last = _request(worker, "long.2", prompts[2])
    carried = last.extras["fish"].prompt_ids
    semantic = [t - worker.ids.semantic_begin for t in carried if t >= worker.ids.semantic_begin]
    assert semantic == spoken[1][:, 0].tolist()  # only the segment just before, with segment_context=1
    _speak(worker, last)
    assert len(worker.spoken) == 0  # the last segment ended: nothing of the request is kept

    off = _worker(tiny_dir, segment_context=0)
    _speak(off, _request(off, "long.0", prompts[0]))
    assert _request(off, "long.1", prompts[1]).extras["fish"].prompt_ids == prompts[1]["token_ids"]


def test_turns_that_would_leave_no_room_for_a_reply_are_left_out():
    def turn(n):
        return SpokenTurn([1, 2], torch.full((10, n), 3))

    prompt, frames = [7, 8, 9, 10], torch.zeros(10, 0, dtype=torch.int64)
    turns = [turn(5), turn(2)]  # 2 + 5 + 1 and 2 + 2 + 1 tokens with a one-token turn end
    ids, kept, n = with_context(prompt, frames, 2, turns, 100, (0,), room=len(prompt) + 5)
    assert n == 1 and ids == [7, 8, 1, 2, 103, 103, 0, 9, 10] and kept.shape == (10, 2)
    ids, kept, n = with_context(prompt, frames, 2, turns, 100, (0,), room=len(prompt) + 13)
    assert n == 2 and kept.shape == (10, 7) and ids[2:10] == [1, 2] + [103] * 5 + [0]
    assert with_context(prompt, frames, 2, turns, 100, (0,), room=len(prompt) + 4)[2] == 0


def test_the_pipeline_carries_each_segment_into_the_next(tiny_dir, tmp_path):
    # the offline API on the real stage graph, seeded: the first segment speaks alike with or
    # without context; the later ones (run in turn) differ once they carry the turns before them
    # (sampled: greedy random weights repeat one frame whatever the prompt)
    from omni_core.api import Omni

    text = " ".join(["This is one sentence of a long text."] * 12)  # three segments
    audio = {}
    for carried in (2, 0):
        options = {"max_new_tokens": 6, "segment_context": carried}
        with Omni("fish-s2pro", model=tiny_dir, device="cpu", options=options, cache_dir=str(tmp_path)) as omni:
            audio[carried] = omni.speech(text, "default", seed=4).audio
    frame = 2048
    assert len(audio[2]) > 2 * 6 * frame  # more than one segment spoke
    assert np.array_equal(audio[2][:frame], audio[0][:frame])
    assert not np.array_equal(audio[2], audio[0])
