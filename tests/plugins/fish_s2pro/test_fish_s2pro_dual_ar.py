"""The dual AR stage's worker on the core engine (as the ``ar`` executor drives it): a request's
frames alone equal its frames batched with seven others, greedy and seeded; the length limit
and a recomputed (preempted) request keep them too."""

from __future__ import annotations

import torch
from omni_core.scheduler.engine import AREngine, EngineConfig
from omni_core.scheduler.executor import Message
from omni_fish_s2pro.checkpoint import load_fast_ar, load_slow_ar
from omni_fish_s2pro.codec_checkpoint import load_codec
from omni_fish_s2pro.config import load_config, load_tokenizer, token_ids
from omni_fish_s2pro.dual_ar_stage import DualARWorker
from omni_fish_s2pro.frontend import Frontend

TEXTS = [
    "Hello there.",
    "A second, longer sentence to speak.",
    "Three",
    "Four and more words",
    "five",
    "Six!",
    "seven?",
    "Eight, the last.",
]


def _worker(tiny_dir, max_new_tokens=24, **engine):
    cfg = load_config(tiny_dir)
    worker = DualARWorker(
        load_slow_ar(tiny_dir),
        load_fast_ar(tiny_dir),
        token_ids(tiny_dir, cfg.codebook_size),
        EngineConfig(block_size=4, **engine),
        max_new_tokens,
    )
    worker.engine = AREngine(worker.model, worker.engine_config, hooks=worker.hooks)
    worker.max_model_len = worker.engine.max_model_len
    return worker


def _payloads(tiny_dir, reference_codes=None):
    frontend = Frontend(load_tokenizer(tiny_dir), token_ids(tiny_dir, 64), load_codec(tiny_dir))
    out = []
    for i, text in enumerate(TEXTS):
        prompt = frontend.prompt({"text": text})
        if i == 1 and reference_codes is not None:  # one request clones: its prompt holds frames
            from omni_fish_s2pro.prompt import build_prompt

            prompt = build_prompt(frontend.tokenizer, frontend.ids, text, "a tone", reference_codes)
        out.append(
            {
                "token_ids": prompt.token_ids,
                "frames": prompt.frames,
                "seed": 100 + i,
                "sampling": {"temperature": 0.0},
            }
        )
    return out


def _run(worker, payloads: dict[str, dict]) -> dict[str, torch.Tensor]:
    frames: dict[str, list[torch.Tensor]] = {rid: [] for rid in payloads}
    ended: set[str] = set()
    for rid, payload in payloads.items():
        worker.engine.add_request(worker.make_request(Message(rid, "in", payload, True, 0)))
    while worker.engine.has_unfinished():
        for out in worker.engine.step():

            def emit(port, payload, end=False, rid=out.request_id):
                frames[rid].append(payload["codes"])
                if end:
                    ended.add(rid)

            worker.on_output(out.request_id, out.new_token_ids, out.finished, out.step_outputs, emit)
    assert ended == set(payloads)
    return {rid: torch.cat(parts) for rid, parts in frames.items()}


def test_frames_alone_equal_frames_batched_with_seven_others(tiny_dir):
    codec = load_codec(tiny_dir)
    reference = codec.encode(torch.sin(torch.arange(30000) / 9.0)[None] * 0.4)[0]
    payloads = _payloads(tiny_dir, reference)
    batched = _run(_worker(tiny_dir), {f"r{i}": p for i, p in enumerate(payloads)})
    for i in (0, 1):
        alone = _run(_worker(tiny_dir), {"solo": payloads[i]})["solo"]
        assert alone.shape[1] == 10 and alone.shape[0] > 0
        assert torch.equal(alone, batched[f"r{i}"])
    assert not torch.equal(batched["r0"][:4], batched["r2"][:4])  # the prompts matter


def test_sampled_frames_repeat_with_the_seed_and_stay_in_range(tiny_dir):
    payload = {**_payloads(tiny_dir)[0], "sampling": {"temperature": 0.9, "top_k": 20}}
    first = _run(_worker(tiny_dir, max_new_tokens=12), {"a": payload, "b": {**payload, "seed": 7}})
    again = _run(_worker(tiny_dir, max_new_tokens=12), {"a": payload})
    assert torch.equal(first["a"], again["a"]) and not torch.equal(first["a"], first["b"][: len(first["a"])])
    assert int(first["a"].min()) >= 0 and int(first["a"].max()) < 64


def test_overlapped_decode_steps_give_the_step_by_step_frames(tiny_dir):
    """The hooks read only the device and the batch's counts, so a decode step is launched before
    the previous one's frame reaches the host (as on a GPU by default): sampled frames, requests
    ending at different steps, the same codes as step by step."""
    payloads = {
        f"r{i}": {**p, "sampling": {"temperature": 0.9, "top_k": 20}} for i, p in enumerate(_payloads(tiny_dir))
    }
    plain = _worker(tiny_dir, max_new_tokens=16, overlap_decode=False)
    overlapped = _worker(tiny_dir, max_new_tokens=16, overlap_decode=True)
    assert overlapped.engine.overlap_decode and not plain.engine.overlap_decode
    launch, ahead = overlapped.engine.runner.launch, []

    def watched(seqs, is_prefill, ahead_of=None):
        ahead.append(ahead_of is not None)
        return launch(seqs, is_prefill, ahead_of)

    overlapped.engine.runner.launch = watched
    expected, got = _run(plain, payloads), _run(overlapped, payloads)
    assert sum(ahead) > 10
    for rid in payloads:
        assert torch.equal(expected[rid], got[rid]), rid

def test_preempted_requests_recompute_the_same_frames(tiny_dir):
    payloads = {f"r{i}": p for i, p in enumerate(_payloads(tiny_dir))}
    roomy = _run(_worker(tiny_dir, max_new_tokens=20), payloads)
    # so few KV blocks that the engine preempts and later recomputes requests
    tight = _worker(tiny_dir, max_new_tokens=20, num_kv_blocks=40)
    squeezed = _run(tight, payloads)
    assert tight.engine.stats()["preemptions"] > 0
    for rid in payloads:
        assert torch.equal(roomy[rid], squeezed[rid]), rid


def test_the_fused_feed_forward_stacks_its_weights_again_when_they_change():
    # the fused path's one gate/up matrix follows loads, casts and moves of w1 and w3
    from omni_fish_s2pro.feed_forward import FeedForward

    ff = FeedForward(8, 12)
    first = ff._stacked()
    assert ff._stacked() is first and torch.equal(first, torch.cat([ff.w1.weight, ff.w3.weight]))
    weights = {k: torch.randn_like(v) for k, v in ff.state_dict().items()}
    ff.load_state_dict(weights)
    assert torch.equal(ff._stacked(), torch.cat([weights["w1.weight"], weights["w3.weight"]]))
    assert ff.double()._stacked().dtype == torch.float64
    assert set(ff.state_dict()) == {"w1.weight", "w3.weight", "w2.weight"}  # the checkpoint's names only
