"""The flow's cache of finished chunks (flow_cache.py) at tiny size: streamed requests batched
through the flow stage's worker give the same mel with the cache as without it (each later call
computing only its new frames), a request refused by the budget falls back to recomputing, and
every request's blocks are freed when it ends or is released."""

from __future__ import annotations

import pytest
import torch
from omni_core.scheduler.executor import Message
from omni_cosyvoice3.checkpoint import load_flow
from omni_cosyvoice3.flow_cache import FlowCache
from omni_cosyvoice3.stage_workers import FlowWorker

TOLERANCE = {"atol": 2e-4, "rtol": 1e-4}


def _streams(seed: int, shapes: list[tuple[int, int]]) -> dict[str, dict]:
    """Per request: prompt tokens, prompt mel, x-vector and generated tokens of the given lengths."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for i, (prompt_len, generated_len) in enumerate(shapes):
        out[f"r{i}"] = {
            "prompt": torch.randint(0, 6561, (prompt_len,), generator=gen).tolist(),
            "prompt_mel": torch.randn(2 * prompt_len, 80, generator=gen),
            "embedding": torch.randn(192, generator=gen),
            "generated": torch.randint(0, 6561, (generated_len,), generator=gen).tolist(),
        }
    return out


def _run(worker: FlowWorker, streams: dict[str, dict], pieces: dict[str, int]) -> dict[str, torch.Tensor]:
    """Feed every request its tokens ``pieces[rid]`` at a time, all requests' messages of a round
    in one batch (as the stage's batcher hands them over); returns each request's whole mel."""
    mels: dict[str, list[torch.Tensor]] = {rid: [] for rid in streams}

    def emit(rid, port, payload, end=False):
        mels[rid].append(payload["mel"])

    conds = [
        Message(rid, "cond", {"prompt_tokens": s["prompt"], "prompt_mel": s["prompt_mel"],
                              "embedding": s["embedding"], "streaming": True}, seq=0)
        for rid, s in streams.items()
    ]
    worker.process(conds, emit)
    sent = dict.fromkeys(streams, 0)
    seq = 0
    while any(sent[rid] < len(s["generated"]) for rid, s in streams.items()):
        seq += 1
        batch = []
        for rid, s in streams.items():
            if sent[rid] >= len(s["generated"]):
                continue
            tokens = s["generated"][sent[rid] : sent[rid] + pieces[rid]]
            sent[rid] += len(tokens)
            end = sent[rid] >= len(s["generated"])
            batch.append(Message(rid, "tokens", {"token_ids": tokens}, end=end, seq=seq))
        worker.process(batch, emit)
    return {rid: torch.cat(m, dim=1) for rid, m in mels.items()}


def _assert_empty(cache: FlowCache) -> None:
    assert cache.requests == {} and cache.refused == set() and cache.bytes_in_use() == 0
    assert sorted(cache.free_blocks) == list(range(1, cache.blocks_total + 1))


SHAPES = [(13, 140), (30, 260), (4, 90)]  # prompt and generated tokens of each request
# tokens a message: the requests' chunks fall due in the same rounds, with different cached lengths,
# and r2's last (full-attention) call shares a batch with the others' cached calls
PIECES = {"r0": 50, "r1": 50, "r2": 50}


def test_streamed_mel_with_the_cache_equals_the_mel_without_it(flow):
    streams = _streams(1, SHAPES)
    plain = _run(FlowWorker(flow, hop=25, max_hop=100), streams, PIECES)
    cache = FlowCache(flow.cfg, 1 << 30, "cpu", flow.dtype)
    batches = []
    make_batch = cache.batch

    def watch(request_ids, ends):  # each cached call's rows: (cached frames, frames after the call)
        batch = make_batch(request_ids, ends)
        batches.append(list(zip(batch.starts, ends, strict=True)))
        return batch

    cache.batch = watch
    cached = _run(FlowWorker(flow, hop=25, max_hop=100, cache=cache), streams, PIECES)
    # calls that computed only frames past a cached prefix, rows with different cached lengths in one call
    assert any(len({start for start, _ in rows}) > 1 and min(s for s, _ in rows) > 0 for rows in batches)
    for rid, s in streams.items():
        assert cached[rid].shape == plain[rid].shape == (80, 2 * len(s["generated"]))
        torch.testing.assert_close(cached[rid], plain[rid], **TOLERANCE)
    _assert_empty(cache)  # every request's last chunk freed its blocks


def test_the_pool_is_allocated_when_the_stage_starts(flow):
    # a budget the device cannot hold then fails at start-up (a ValueError naming flow_cache_bytes),
    # not in a request
    cache = FlowCache(flow.cfg, 1 << 20, "cpu", flow.dtype)
    assert cache.keys is not None and cache.keys.shape[3] == (cache.blocks_total + 1) * cache.block


def test_a_request_refused_by_the_budget_recomputes_and_gives_the_same_mel(flow):
    """A budget of 8 blocks: r1 (30 prompt tokens, 260 generated) outgrows it while the others
    hold blocks, is refused, and from then on recomputes all its frames on each call."""
    streams = _streams(2, SHAPES)
    probe = FlowCache(flow.cfg, 0, "cpu", flow.dtype)
    cache = FlowCache(flow.cfg, 8 * probe.block * probe.frame_bytes, "cpu", flow.dtype)
    assert cache.blocks_total == 8
    refused = []
    reserve = cache.reserve

    def watch(request_id, frames, last=False):  # record refusals as they happen (the set empties at the end)
        ok = reserve(request_id, frames, last)
        if not ok and request_id in cache.refused:
            refused.append(request_id)
        return ok

    cache.reserve = watch
    odd = {"r0": 7, "r1": 11, "r2": 5}  # tokens arriving in uneven pieces, as from the llm
    plain = _run(FlowWorker(flow, hop=25, max_hop=100), streams, odd)
    cached = _run(FlowWorker(flow, hop=25, max_hop=100, cache=cache), streams, odd)
    assert "r1" in refused
    for rid in streams:
        torch.testing.assert_close(cached[rid], plain[rid], **TOLERANCE)
    _assert_empty(cache)


def test_a_released_request_frees_its_blocks(flow):
    streams = _streams(3, [(13, 200)])
    cache = FlowCache(flow.cfg, 1 << 30, "cpu", flow.dtype)
    worker = FlowWorker(flow, hop=25, max_hop=100, cache=cache)
    s = streams["r0"]
    cond = {"prompt_tokens": s["prompt"], "prompt_mel": s["prompt_mel"], "embedding": s["embedding"], "streaming": True}
    worker.process([Message("r0", "cond", cond, seq=0)], lambda *a, **k: None)
    worker.process([Message("r0", "tokens", {"token_ids": s["generated"][:120]}, end=False, seq=1)], lambda *a, **k: None)
    assert cache.cached_frames("r0") == 2 * (13 + 87) and cache.bytes_in_use() > 0
    worker.release("r0")  # a client that went away mid-stream
    _assert_empty(cache)


def test_a_masked_last_call_runs_on_the_cache_and_equals_the_chunk_masked_one_shot(flow):
    """``flow_last_call=masked``: the last call keeps the chunk mask, so it too computes only its
    new frames (ending inside a chunk), and the streamed mel is one chunk-masked call's."""
    from omni_cosyvoice3.flow import FlowRequest

    streams = _streams(4, SHAPES)
    cache = FlowCache(flow.cfg, 1 << 30, "cpu", flow.dtype)
    ends = []
    make_batch = cache.batch

    def watch(request_ids, frames):
        ends.extend(frames)
        return make_batch(request_ids, frames)

    cache.batch = watch
    cached = _run(FlowWorker(flow, hop=25, max_hop=100, cache=cache, masked_last=True), streams, PIECES)
    plain = _run(FlowWorker(flow, hop=25, max_hop=100, masked_last=True), streams, PIECES)
    assert any(end % 50 for end in ends)  # last calls ended inside a chunk, on the cache
    for rid, s in streams.items():
        whole = FlowRequest(
            torch.tensor(s["prompt"] + s["generated"]), len(s["prompt"]), s["prompt_mel"], s["embedding"], True, True
        )
        torch.testing.assert_close(cached[rid], flow.infer([whole])[0], **TOLERANCE)
        torch.testing.assert_close(cached[rid], plain[rid], **TOLERANCE)
    _assert_empty(cache)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("cache_graphs", [False, True])
def test_the_cache_on_cuda_in_bfloat16_agrees_with_the_graphs(tiny_dir, cache_graphs):
    """On CUDA the uncached calls replay bucketed graphs; the cached ones run eagerly, or replay
    graphs of their own per (batch, queries, keys) bucket: bf16 rounding apart, the same mel."""
    model = load_flow(tiny_dir).to("cuda", torch.bfloat16)
    model.use_graphs(batches=(1, 2, 4), frames=(64, 128, 256, 512, 1024))
    streams = _streams(5, SHAPES)
    plain = _run(FlowWorker(model, hop=25, max_hop=100), streams, PIECES)
    cache = FlowCache(model.cfg, 1 << 28, "cuda", model.dtype, use_graphs=cache_graphs)
    cached = _run(FlowWorker(model, hop=25, max_hop=100, cache=cache), streams, PIECES)
    for rid in streams:
        assert cached[rid].shape == plain[rid].shape
        assert float((cached[rid] - plain[rid]).norm() / plain[rid].norm()) < 0.05
    _assert_empty(cache)
    assert (cache.graphs is not None and len(cache.graphs.graphs) > 0) == cache_graphs
    if cache_graphs:  # the captured buckets replay: the same mel again
        again = _run(FlowWorker(model, hop=25, max_hop=100, cache=cache), _streams(5, SHAPES), PIECES)
        for rid in streams:
            torch.testing.assert_close(again[rid], cached[rid])


def test_a_first_call_batched_with_a_long_cached_request(flow):
    """A request's first call (all its frames new, a long prompt) in one cached call with a
    request far into its reply (few new frames after many cached): each gets its mel."""
    streams = _streams(6, [(13, 400), (150, 60)])
    old, new = streams["r0"]["generated"], streams["r1"]["generated"]

    def cond(s):
        return {"prompt_tokens": s["prompt"], "prompt_mel": s["prompt_mel"], "embedding": s["embedding"], "streaming": True}

    script = [  # r0 reaches 287 tokens; then r0's chunk to 387 beside r1's first chunk; then both end
        [Message("r0", "cond", cond(streams["r0"]), seq=0)],
        [Message("r0", "tokens", {"token_ids": old[:290]}, end=False, seq=1)],
        [Message("r1", "cond", cond(streams["r1"]), seq=0)],
        [
            Message("r0", "tokens", {"token_ids": old[290:390]}, end=False, seq=2),
            Message("r1", "tokens", {"token_ids": new[:40]}, end=False, seq=1),
        ],
        [
            Message("r0", "tokens", {"token_ids": old[390:]}, end=True, seq=3),
            Message("r1", "tokens", {"token_ids": new[40:]}, end=True, seq=2),
        ],
    ]

    def play(worker):
        mels = {"r0": [], "r1": []}
        for batch in script:
            worker.process(batch, lambda rid, port, payload, end=False: mels[rid].append(payload["mel"]))
        return {rid: torch.cat(m, dim=1) for rid, m in mels.items()}

    plain = play(FlowWorker(flow, hop=25, max_hop=100))
    cache = FlowCache(flow.cfg, 1 << 30, "cpu", flow.dtype)
    batches = []
    make_batch = cache.batch

    def watch(request_ids, ends):
        batch = make_batch(request_ids, ends)
        batches.append((batch.starts, ends))
        return batch

    cache.batch = watch
    cached = play(FlowWorker(flow, hop=25, max_hop=100, cache=cache))
    assert ([2 * (13 + 287), 0], [2 * (13 + 387), 2 * (150 + 25)]) in batches
    for rid in streams:
        torch.testing.assert_close(cached[rid], plain[rid], **TOLERANCE)
    _assert_empty(cache)


def test_a_cached_call_padded_to_a_graph_bucket_keeps_its_rows(flow):
    """What the cached calls' CUDA graphs rely on, checked on the CPU: padded to more rows, query
    frames and key frames (``pad_cached_inputs``), a cached call's real rows give the same mel
    and the same position-conv context on every real frame."""
    from omni_cosyvoice3.flow import FlowRequest
    from omni_cosyvoice3.flow_cache import pad_cached_inputs

    streams = _streams(7, [(13, 200), (40, 100)])
    cache = FlowCache(flow.cfg, 1 << 28, "cpu", flow.dtype)

    def request(rid, generated):
        s = streams[rid]
        tokens = torch.tensor(s["prompt"] + s["generated"][: generated + 3])
        return FlowRequest(tokens, len(s["prompt"]), s["prompt_mel"], s["embedding"], False, True, 0, rid)

    flow.infer([request("r0", 87)], cache)  # r0 has 200 frames cached, r1 none
    batch = [request("r0", 187), request("r1", 60)]
    assert all(cache.reserve(r.request_id, flow.total_frames(r)) for r in batch)
    call, tensors = flow.cached_inputs(batch, cache)
    assert call.starts == [200, 0] and call.new == [200, 200]
    mel, conv = flow._unpack(flow.decode_cached(cache, **tensors), cache)
    padded = pad_cached_inputs(tensors, 4, 256, 512)
    mel_p, conv_p = flow._unpack(flow.decode_cached(cache, **padded), cache)
    for i, n in enumerate(call.new):
        torch.testing.assert_close(mel_p[i, :, :n], mel[i, :, :n], **TOLERANCE)
        torch.testing.assert_close(conv_p[:, :, i], conv[:, :, i], **TOLERANCE)
