"""The codec of the tiny preset, read from its codec.pth: encode shapes, causality, and a stream
decoded chunk by chunk (CodecStream, as the codec stage does) joined against the whole decode."""

from __future__ import annotations

import pytest
import torch
from omni_fish_s2pro.codec_checkpoint import FILE, load_codec, official_state, read_state
from omni_fish_s2pro.codec_stream import CodecStream, decode_together


@pytest.fixture(scope="module")
def codec(tiny_dir):
    return load_codec(tiny_dir)


def _codes(codec, frames: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    sizes = codec.sizes
    semantic = torch.randint(0, sizes.semantic_codebook_size, (1, frames), generator=gen)
    residual = torch.randint(0, sizes.codebook_size, (sizes.n_codebooks, frames), generator=gen)
    return torch.cat([semantic, residual])


def test_codec_pth_is_weight_normed_and_loads_back_the_same_model(tiny_dir, codec):
    raw = torch.load(f"{tiny_dir}/{FILE}", weights_only=True)
    assert "encoder.block.0.conv.parametrizations.weight.original0" in raw
    assert "quantizer.quantizer.quantizers.0.in_proj.weight_g" in raw
    assert "quantizer.post_module.layers.0.attention.wqkv.weight" in raw
    assert codec.hop == 2048 and codec.num_codebooks == 10  # the official strides and codebooks
    again = official_state(codec)
    assert set(again) == set(raw)
    assert all(torch.allclose(again[k], raw[k], atol=1e-6) for k in raw)
    folded = read_state(f"{tiny_dir}/{FILE}")  # each magnitude/direction pair folded into one weight
    assert (
        folded["encoder.block.0.conv.weight"].shape
        == raw["encoder.block.0.conv.parametrizations.weight.original1"].shape
    )


def test_codec_pth_under_a_training_wrapper_loads_and_a_missing_tensor_is_named(tiny_dir, codec, tmp_path):
    raw = torch.load(f"{tiny_dir}/{FILE}", weights_only=True)
    extra = {
        "discriminator.conv.weight": torch.zeros(2),
        "generator.quantizer.distill.weight": torch.zeros(2),
    }
    wrapped = {f"generator.{k}": v for k, v in raw.items()} | extra  # a tensor the codec lacks is skipped
    torch.save({"state_dict": wrapped}, tmp_path / FILE)
    again = load_codec(tmp_path)
    codes = _codes(codec, 6)
    assert torch.equal(again.decode(codes[None]), codec.decode(codes[None]))
    del raw["decoder.model.0.conv.bias"]
    torch.save(raw, tmp_path / FILE)
    with pytest.raises(ValueError, match=r"missing \['decoder.model.0.conv.bias'\]"):
        load_codec(tmp_path)


def test_encode_gives_a_frame_per_2048_samples_in_codebook_range(codec):
    audio = torch.sin(torch.arange(44100 + 100) / 7.0)[None] * 0.5
    codes = codec.encode(audio)
    assert codes.shape == (1, 10, 22)  # ceil(44200 / 2048)
    assert int(codes[:, 0].max()) < codec.sizes.semantic_codebook_size
    assert int(codes[:, 1:].max()) < codec.sizes.codebook_size and int(codes.min()) >= 0


def test_decode_is_causal(codec):
    codes = _codes(codec, 20)
    changed = codes.clone()
    changed[:, 12:] = _codes(codec, 8, seed=1)
    a, b = codec.decode(codes[None])[0], codec.decode(changed[None])[0]
    assert a.shape == (20 * 2048,)
    assert torch.equal(a[: 12 * 2048], b[: 12 * 2048])
    assert not torch.allclose(a[12 * 2048 :], b[12 * 2048 :])


@pytest.mark.parametrize("chunks", [(4, 4, 8, 16, 8), (1, 1, 2, 3, 33), (40,)])
def test_streamed_decode_joined_equals_the_whole_decode(codec, chunks):
    codes = _codes(codec, sum(chunks), seed=2)
    whole = codec.decode(codes[None])[0]
    stream, parts, at = CodecStream(codec), [], 0
    for n in chunks:
        parts.append(stream.decode(codes[:, at : at + n]))
        at += n
    joined = torch.cat(parts)
    assert joined.shape == whole.shape
    torch.testing.assert_close(joined, whole, atol=1e-5, rtol=0)


def test_streams_decoded_together_equal_each_decoded_alone(codec):
    histories = [_codes(codec, 5, seed=s) for s in (4, 5, 6)]
    nexts = [_codes(codec, 4, seed=s) for s in (7, 8, 9)]
    alone, together = [], [CodecStream(codec) for _ in histories]
    for history, following in zip(histories, nexts, strict=True):
        stream = CodecStream(codec)
        stream.decode(history)
        alone.append(stream.decode(following))
    decode_together(together, histories)  # different codes, the same shapes: one batch
    for got, expected in zip(decode_together(together, nexts), alone, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="equal chunks"):
        decode_together([CodecStream(codec), together[0]], nexts[:2])


def test_too_little_left_context_is_not_the_whole_decode(codec):
    # the tolerance above is meaningful: without context the convolutions restart at each chunk
    codes = _codes(codec, 16, seed=3)
    whole = codec.decode(codes[None])[0]
    stream = CodecStream(codec, left_context=0)
    joined = torch.cat([stream.decode(codes[:, :8]), stream.decode(codes[:, 8:])])
    assert (joined - whole).abs().max() > 1e-3
