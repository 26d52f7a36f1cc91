"""The model modules at tiny size: shapes, batching invariance, and streamed == one-shot output
where the model is causal (flow under its chunk mask, HiFT's stable prefix)."""

from __future__ import annotations

import torch
from omni_cosyvoice3.chunking import FlowStream
from omni_cosyvoice3.config import load_config
from omni_cosyvoice3.flow import FlowRequest
from omni_cosyvoice3.ras import RasParams, ras_sample


def _request(tokens, prompt_len, finalize, streaming=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return FlowRequest(
        tokens=tokens,
        prompt_token_len=prompt_len,
        prompt_mel=torch.randn(2 * prompt_len, 80, generator=gen),
        embedding=torch.randn(192, generator=gen),
        finalize=finalize,
        streaming=streaming,
    )


def test_config_reads_the_tiny_and_official_sizes(tiny_dir, tmp_path):
    cfg = load_config(tiny_dir)
    assert (cfg.flow.dim, cfg.flow.depth, cfg.hift.base_channels) == (64, 2, 32)
    assert cfg.flow.static_chunk_size == 50 and cfg.hift.samples_per_frame == 480
    official = (load_config.__globals__["Path"](tiny_dir) / "cosyvoice3.yaml").read_text()
    official = (
        official.replace("dim: 64", "dim: 1024")
        .replace("depth: 2", "depth: 22")
        .replace("heads: 2", "heads: 16")
    )
    (tmp_path / "cosyvoice3.yaml").write_text(official)
    full = load_config(tmp_path)
    assert (full.flow.dim, full.flow.depth, full.flow.heads, full.llm.top_k, full.llm.win_size) == (
        1024,
        22,
        16,
        25,
        10,
    )


def test_flow_streamed_chunks_equal_the_references_streamed_output(flow):
    """Chunks decoded as the tokens arrive, with the chunk mask, and a last call over all the
    tokens with full attention (the reference's streaming rule): the chunks before the last equal
    one chunk-masked call over all the tokens, the last equals one full-attention call's tail."""
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 6561, (13,), generator=gen).tolist()
    generated = torch.randint(0, 6561, (140,), generator=gen).tolist()
    masked = flow.infer([_request(torch.tensor(prompt + generated), len(prompt), finalize=True)])[0]
    base = _request(torch.tensor(prompt + generated), len(prompt), finalize=True, streaming=False)
    full = flow.infer([base])[0]
    assert masked.shape == full.shape == (80, 2 * len(generated)) and not torch.allclose(masked, full, atol=1e-3)

    stream = FlowStream(prompt, base.prompt_mel, base.embedding, streaming=True)
    pieces, ends = [], []
    for token in generated:  # tokens arrive one at a time, as from the llm
        stream.tokens.append(token)
        due = stream.next_end()
        if due is None:
            continue
        end, final = due
        mel = flow.infer(
            [
                FlowRequest(
                    stream.flow_tokens(end, final), len(prompt), base.prompt_mel, base.embedding, final, True
                )
            ]
        )[0]
        pieces.append(mel[:, stream.offset * 2 : end * 2])
        ends.append(end)
        stream.advance(end, final)
    stream.finished = True
    end, final = stream.next_end()
    mel = flow.infer(
        [FlowRequest(stream.flow_tokens(end, final), len(prompt), base.prompt_mel, base.embedding, True, False)]
    )[0]
    pieces.append(mel[:, stream.offset * 2 :])
    # first hop padded so prompt + hop is a multiple of 25, then the hop doubles up to 100
    assert ends == [37, 87]
    streamed = torch.cat(pieces, dim=1)
    expected = torch.cat([masked[:, : 87 * 2], full[:, 87 * 2 :]], dim=1)
    assert streamed.shape == expected.shape
    torch.testing.assert_close(streamed, expected, atol=2e-4, rtol=1e-4)


def test_flow_batch_equals_single_requests(flow):
    gen = torch.Generator().manual_seed(2)
    a = _request(torch.randint(0, 6561, (60,), generator=gen), 10, finalize=True, seed=3)
    b = _request(torch.randint(0, 6561, (31,), generator=gen), 0, finalize=False, seed=4)
    c = _request(torch.randint(0, 6561, (45,), generator=gen), 5, finalize=True, streaming=False, seed=5)
    batched = flow.infer([a, b, c])
    for request, mel in zip([a, b, c], batched, strict=True):
        torch.testing.assert_close(mel, flow.infer([request])[0], atol=2e-4, rtol=1e-4)
    assert [m.shape[1] for m in batched] == [100, 56, 80]


def test_full_attention_differs_from_chunk_mask(flow):
    request = _request(torch.randint(0, 6561, (80,)), 0, finalize=True)
    full = _request(request.tokens, 0, finalize=True, streaming=False)
    chunked, unmasked = flow.infer([request])[0], flow.infer([full])[0]
    # the first 50-frame chunk sees nothing to its right in either mode only under the mask
    assert not torch.allclose(chunked[:, :50], unmasked[:, :50])


def test_hift_stable_prefix_and_batching(hift):
    gen = torch.Generator().manual_seed(0)
    mel = torch.randn(2, 80, 60, generator=gen) * 0.5 - 4
    full = hift(mel)
    assert full.shape == (2, 60 * 480) and full.abs().max() <= 0.99
    cut = hift.stable_samples(35, finalize=False)
    assert cut == (35 - 8) * 480
    torch.testing.assert_close(hift(mel[:, :, :35])[:, :cut], full[:, :cut], atol=1e-5, rtol=1e-4)
    single = hift(mel[1:, :, :40])
    torch.testing.assert_close(
        single[0], hift(torch.cat([mel[1:, :, :40], mel[:1, :, :40]]))[0], atol=1e-5, rtol=1e-4
    )


def test_hift_streams_in_windows_equal_to_the_whole_utterance(hift):
    """The worker vocodes each chunk from a window just before its new samples (not from the
    utterance's start), carrying the excitation's phase from window to window: the streamed audio
    equals one pass over the whole mel, and the mel it keeps stays a window long."""
    import copy

    from omni_core.pipeline import Message
    from omni_cosyvoice3.hift import WINDOW_CONTEXT
    from omni_cosyvoice3.stage_workers import HiftWorker

    hift = copy.deepcopy(hift)
    with torch.no_grad():  # random weights predict ~0 Hz (silence): a voiced pitch that moves
        hift.f0_predictor.classifier.weight.mul_(400)
        hift.f0_predictor.classifier.bias.fill_(220)
    gen = torch.Generator().manual_seed(1)
    mel = torch.randn(80, 420, generator=gen) * 0.5 - 4
    whole = hift(mel[None])[0]
    f0 = hift.f0_predictor(mel[None].double())
    assert (f0 > hift.cfg.nsf_voiced_threshold).float().mean() > 0.9 and f0.std() > 2
    worker, streamed, kept = HiftWorker(hift), [], []
    bounds = [0, 80, 180, 380, 420]
    for seq, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        end = b == bounds[-1]
        message = Message("r", "mel", {"mel": mel[:, a:b]}, end, seq)
        worker.process([message], lambda rid, port, payload, end=True: streamed.append(payload["audio"]))
        if not end:
            kept.append((worker.streams["r"].first, worker.streams["r"].mel.shape[1]))
    audio = torch.cat(streamed)
    assert audio.shape == whole.shape
    torch.testing.assert_close(audio, whole, atol=2e-5, rtol=1e-4)
    # after the third chunk the worker keeps only the reach before what it sent, not the whole mel
    assert kept[-1] == (380 - 8 - WINDOW_CONTEXT, WINDOW_CONTEXT + 8) and not worker.streams


ONLY_6561 = torch.arange(6761) == 6561  # what a row under its minimum cannot draw, as the reference


def _ras(top_k=25, top_p=0.8, temperature=1.0, rows=1):
    return RasParams(
        top_p=torch.full((rows,), top_p),
        top_k=torch.full((rows,), top_k, dtype=torch.int64),
        temperature=torch.full((rows,), temperature),
        k_max=top_k,
        win_size=10,
        tau_r=0.1,
    )


def test_ras_repetition_redraws_and_min_length_blocks_only_6561():
    logits = torch.full((2, 6761), -30.0)
    logits[:, 5] = 10.0  # one dominant token
    logits[:, 6561] = 9.0  # the id blocked under the minimum, the runner-up
    history = torch.tensor([[-1] * 10, [5] + [-1] * 9])
    u = torch.tensor([[0.3, 0.3], [0.3, 0.3]])
    out = ras_sample(logits, history, _ras(rows=2), u, torch.tensor([False, False]), ONLY_6561)
    assert out[0] == 5  # nucleus pick
    assert out[1] == 6561  # 5 was just used: banned, redrawn from the rest
    blocked = ras_sample(logits, history, _ras(rows=2), u, torch.tensor([False, True]), ONLY_6561)
    assert blocked[1] < 6561  # under the minimum length 6561 cannot win
    # the reference blocks 6561 alone: another id past the codebook is still drawn
    logits[:, 6561], logits[:, 6562] = -30.0, 9.0
    assert ras_sample(logits, history, _ras(rows=2), u, torch.tensor([False, True]), ONLY_6561)[1] == 6562


def test_ras_is_a_function_of_its_uniforms():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 6761, generator=gen)
    history = torch.full((4, 10), -1)
    u = torch.rand(4, 2, generator=gen)
    params = _ras(rows=4)
    first = ras_sample(logits, history, params, u, torch.zeros(4, dtype=torch.bool), ONLY_6561)
    again = ras_sample(logits, history, params, u, torch.zeros(4, dtype=torch.bool), ONLY_6561)
    assert torch.equal(first, again)
    greedy = ras_sample(logits, history, _ras(top_k=1, rows=4), u, torch.zeros(4, dtype=torch.bool), ONLY_6561)
    assert torch.equal(greedy, logits.argmax(dim=-1))
    draws = {
        int(
            ras_sample(logits[:1], history[:1], _ras(), torch.tensor([[x, 0.5]]), torch.tensor([False]), ONLY_6561)
        )
        for x in (0.05, 0.35, 0.65, 0.95)
    }
    assert len(draws) > 1  # different uniforms reach different tokens of the nucleus


def test_packed_projections_equal_the_checkpoint_layout(flow):
    from omni_cosyvoice3.flow import FlowModel

    plain = FlowModel(flow.cfg).eval()  # separate q/k/v and per-block modulation, as saved
    plain.load_state_dict(flow.state_dict())
    request = _request(torch.randint(0, 6561, (50,)), 7, finalize=False)
    torch.testing.assert_close(plain.infer([request])[0], flow.infer([request])[0], atol=1e-4, rtol=1e-4)


def test_flow_stage_makes_its_last_call_with_full_attention(flow):
    """The flow stage fed a stream of tokens: every chunk but the last is the chunk-masked
    decode's, the last is the tail of one full-attention call over all the tokens."""
    from omni_core.scheduler.executor import Message
    from omni_cosyvoice3.stage_workers import FlowWorker

    gen = torch.Generator().manual_seed(4)
    prompt = torch.randint(0, 6561, (13,), generator=gen).tolist()
    generated = torch.randint(0, 6561, (100,), generator=gen).tolist()
    base = _request(torch.tensor(prompt + generated), len(prompt), finalize=True, streaming=False)
    worker = FlowWorker(flow, hop=25, max_hop=100)
    mels = []
    cond = {"prompt_tokens": prompt, "prompt_mel": base.prompt_mel, "embedding": base.embedding, "streaming": True}
    worker.process([Message("r", "cond", cond, seq=0)], lambda rid, port, payload, end=False: None)
    for i in range(0, len(generated), 10):  # tokens in pieces, the last piece ends the stream
        last = i + 10 >= len(generated)
        message = Message("r", "tokens", {"token_ids": generated[i : i + 10]}, end=last, seq=i // 10)
        worker.process([message], lambda rid, port, payload, end=False: mels.append(payload["mel"]))
    streamed = torch.cat([m for m in mels if m.numel()], dim=1)
    masked = flow.infer([_request(torch.tensor(prompt + generated), len(prompt), finalize=True)])[0]
    full = flow.infer([base])[0]
    last = sum(m.shape[1] for m in mels[:-1])
    assert 0 < last < streamed.shape[1] == full.shape[1]
    torch.testing.assert_close(streamed[:, :last], masked[:, :last], atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(streamed[:, last:], full[:, last:], atol=2e-4, rtol=1e-4)


def test_hift_keeps_f0_in_float64_and_its_phase_does_not_drift(hift):
    """20 s of voiced F0 (a slow vibrato around 220 Hz): the excitation equals the same module's
    in float64 to ~1e-6 (summed in float32, the phase drifted it by ~3e-4); the F0 predictor
    stays float64 whatever the generator is cast to."""
    import copy

    frames = 20 * 24000 // hift.cfg.samples_per_frame
    t = torch.arange(frames, dtype=torch.float64) / 50
    f0 = (220 + 30 * torch.sin(2 * torch.pi * 0.5 * t))[None]
    ours, _ = hift.m_source(f0.float())
    reference = copy.deepcopy(hift.m_source).double()
    reference.noise_table = reference.noise_table.double()
    expected, _ = reference(f0)
    assert (ours.double() - expected).abs().max() < 5e-6
    half = copy.deepcopy(hift).to(torch.bfloat16)
    assert half.f0_predictor.classifier.weight.dtype == torch.float64 and half.conv_post.weight.dtype == torch.bfloat16
