"""Bucketed CUDA graphs of the flow and HiFT: the padding they rely on leaves real frames and
samples unchanged (checked on the CPU), and on CUDA graph replay equals the eager path."""

from __future__ import annotations

import pytest
import torch
from omni_cosyvoice3.checkpoint import load_flow, load_hift
from omni_cosyvoice3.flow import FlowRequest, pad_flow_inputs
from omni_cosyvoice3.graph_buckets import GraphBuckets, parse_buckets, parse_warm
from omni_cosyvoice3.hift import HiftWindow, pad_hift_inputs
from omni_cosyvoice3.stft import FrameSTFT

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


def _flow_requests(seed: int = 0) -> list[FlowRequest]:
    gen = torch.Generator().manual_seed(seed)

    def one(n_tokens, prompt_len, finalize, streaming):
        return FlowRequest(
            torch.randint(0, 6561, (n_tokens,), generator=gen),
            prompt_len,
            torch.randn(2 * prompt_len, 80, generator=gen),
            torch.randn(192, generator=gen),
            finalize,
            streaming,
        )

    # a streaming chunk (lookahead held back), a final streaming call, a non-streaming call
    return [one(53, 25, False, True), one(71, 9, True, True), one(40, 6, True, False)]


def _mels(lengths, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(80, n, generator=gen) * 0.5 - 4 for n in lengths]


def test_padded_flow_batch_leaves_real_frames_unchanged(flow):
    inputs, frames = flow.prepare(_flow_requests())
    t = inputs["mu"].shape[2]
    eager = flow.decoder(**inputs)
    padded = pad_flow_inputs(inputs, 4, t + 37)  # a dummy row and frames past every row's end
    assert padded["mu"].shape == (4, 80, t + 37) and bool(padded["valid"][3].all())
    out = flow.decoder(**padded)
    assert out.shape == (4, 80, t + 37) and torch.isfinite(out).all()
    for i, n in enumerate(frames):
        torch.testing.assert_close(out[i, :, :n], eager[i, :, :n], atol=1e-4, rtol=1e-4)


def test_frame_stft_matches_torch_stft_and_istft():
    gen = torch.Generator().manual_seed(0)
    stft, window = FrameSTFT(16, 4), torch.hann_window(16, periodic=True)
    x = torch.randn(2, 960, generator=gen)
    ref = torch.stft(x, 16, 4, 16, window=window, return_complex=True)
    torch.testing.assert_close(stft(x), torch.cat([ref.real, ref.imag], dim=1), atol=1e-5, rtol=1e-5)
    # a row shorter than the batch reflects at its own end
    short = torch.stft(x[:, :480], 16, 4, 16, window=window, return_complex=True)
    got = stft(x, torch.tensor([480, 480]))[:, :, : short.shape[2]]
    torch.testing.assert_close(got, torch.cat([short.real, short.imag], dim=1), atol=1e-5, rtol=1e-5)
    spec = torch.randn(2, 18, 241, generator=gen)
    complex_spec = torch.complex(spec[:, :9], spec[:, 9:])
    full = torch.istft(complex_spec, 16, 4, 16, window=window)
    torch.testing.assert_close(stft.inverse(spec), full, atol=1e-5, rtol=1e-5)
    cut = torch.istft(complex_spec[:, :, :121], 16, 4, 16, window=window)
    got = stft.inverse(spec, torch.tensor([121, 121]))[:, : cut.shape[1]]
    torch.testing.assert_close(got, cut, atol=1e-5, rtol=1e-5)


def test_hift_padded_batch_equals_each_row_alone_to_its_last_sample(hift):
    mels = _mels([23, 40, 9])
    batched = hift.infer(mels)
    for mel, audio in zip(mels, batched, strict=True):
        alone = hift(mel[None])[0]
        assert audio.shape == alone.shape == (mel.shape[1] * 480,)
        torch.testing.assert_close(audio, alone, atol=2e-5, rtol=1e-4)
    # padded to a bucket with a dummy row, as a graph replay sees it
    inputs = {"mel": torch.zeros(3, 80, 40), "lengths": torch.tensor([23, 40, 9])}
    for i, mel in enumerate(mels):
        inputs["mel"][i, :, : mel.shape[1]] = mel
    out = hift(**pad_hift_inputs(inputs, 4, 64))
    for i, audio in enumerate(batched):
        torch.testing.assert_close(out[i, : audio.numel()], audio, atol=2e-5, rtol=1e-4)


def test_graph_bucket_options(tiny_dir):
    from omni_cosyvoice3.topology import build

    with pytest.raises(ValueError, match="exceeds the largest bucket"):
        build(tiny_dir, {"flow_graphs": "64x128", "max_batch": 8})
    assert parse_buckets("256, 64,128") == (64, 128, 256)
    assert parse_warm("batch1", (1, 2), (64, 128)) == [(1, 64), (1, 128)]
    assert parse_warm("all", (1, 2), (64,)) == [(1, 64), (2, 64)]
    assert parse_warm("2x128, 1x64", (1, 2), (64, 128)) == [(2, 128), (1, 64)]
    assert parse_warm("none", (1,), (64,)) == []
    with pytest.raises(ValueError, match="BATCHxFRAMES"):
        parse_warm("2by128", (1, 2), (64,))
    with pytest.raises(ValueError, match="positive"):
        parse_buckets("0,64")


def test_calls_past_max_work_have_no_bucket():
    """Large calls (batch x frames past max_work) run eagerly: no bucket, nothing captured for them."""
    buckets = GraphBuckets(None, None, None, (1, 4, 32), (64, 256, 1024), torch.device("cpu"), max_work=8192)
    assert buckets.bucket(1, 700) == (1, 1024)
    assert buckets.bucket(3, 200) == (4, 256)
    assert buckets.bucket(20, 100) == (32, 256)
    assert buckets.bucket(20, 300) is None  # 32 x 1024 > 8192
    assert buckets.bucket(1, 2000) is None  # past the largest frame bucket
    buckets.warm([(32, 1024), (4, 2048)])  # both past the limit: skipped, not captured
    assert buckets.graphs == {}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@needs_cuda
def test_flow_graphs_equal_eager_on_cuda(tiny_dir):
    model = load_flow(tiny_dir).to("cuda", torch.bfloat16)
    requests = _flow_requests(1)
    eager = model.infer(requests)
    graphs = model.use_graphs(batches=(1, 4), frames=(64, 128, 256), warm=[(1, 64)])
    assert (1, 64) in graphs.graphs
    replayed = model.infer(requests)  # batch 3, 142 frames -> bucket 4x256, captured now
    assert (4, 256) in graphs.graphs
    for a, b in zip(replayed, eager, strict=True):
        assert a.shape == b.shape and _rel(a, b) < 0.05  # bf16: other kernels for other shapes
    # the same padded shape eagerly: the graph replays what it captured
    inputs, frames = model.prepare(requests)
    padded = model.decoder(**pad_flow_inputs(inputs, 4, 256))
    for i, n in enumerate(frames):
        torch.testing.assert_close(graphs.run(inputs, 3, max(frames))[i, :, :n], padded[i, :, :n])
    again = model.infer(requests)
    for a, b in zip(again, replayed, strict=True):
        assert torch.equal(a, b)
    single = model.infer(requests[:1])  # 100 frames: bucket 1x128
    assert (1, 128) in graphs.graphs and _rel(single[0], eager[0]) < 0.05
    graphs.frames = (64,)  # now too long for every bucket: the eager path
    assert graphs.run(inputs, 3, max(frames)) is None
    for a, b in zip(model.infer(requests), eager, strict=True):
        torch.testing.assert_close(a, b, atol=1e-2, rtol=1e-2)


@needs_cuda
def test_hift_graphs_equal_eager_on_cuda(tiny_dir):
    model = load_hift(tiny_dir).to("cuda")
    mels = _mels([23, 60, 9], seed=2)
    eager = model.infer(mels)
    graphs = model.use_graphs(batches=(1, 2, 4), frames=(32, 64), warm=[(1, 32)])
    replayed = model.infer(mels)  # 3 x 60 frames -> bucket 4x64
    assert set(graphs.graphs) == {(1, 32), (4, 64)}
    for a, b in zip(replayed, eager, strict=True):
        # float32 convolutions may use TF32 with other algorithms for other shapes
        assert a.shape == b.shape and _rel(a, b) < 0.02
    longer = _mels([100], seed=3)  # beyond the largest frame bucket: eager
    torch.testing.assert_close(model.infer(longer)[0], model(longer[0][None].cuda())[0], atol=1e-4, rtol=1e-3)
    # windows of streams past their start (their own noise offset and carried phase) replay too
    phase = torch.rand(2, model.cfg.nb_harmonics + 1, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    windows = [HiftWindow(mels[0], 40, phase[0], 12), HiftWindow(mels[1], 100, phase[1], 30)]
    replayed = model.infer_windows(windows)
    model.graphs = None
    for (a, carry_a), (b, carry_b) in zip(replayed, model.infer_windows(windows), strict=True):
        assert a.shape == b.shape and _rel(a, b) < 0.02
        torch.testing.assert_close(carry_a, carry_b, atol=1e-9, rtol=0)
