"""Preprocessing: image patches as transformers' Qwen2-VL PIL processor makes them, the
checkpoint's own chat template, placeholder expansion and multimodal rotary positions as
transformers' get_rope_index computes them, video frames, and bad media refused."""

from __future__ import annotations

import json
import shutil
import struct
import zlib

import numpy as np
import pytest
import torch
from omni_core.scheduler.executor import Message
from omni_core.serve.exceptions import InvalidInput

from .conftest import LIMITS, mp4, noise, png


@pytest.fixture(scope="module")
def ckpt(tiny_dir):
    from omni_qwen3_omni.config import load_checkpoint

    return load_checkpoint(tiny_dir)


def preprocess(ckpt, messages, **limits):
    from omni_qwen3_omni.stages import Preprocessor

    out = {}
    Preprocessor(ckpt, {**LIMITS, **limits})(
        Message("r", "in", {"task": "chat", "messages": messages, "sampling": {}}),
        lambda port, payload, end=True: out.__setitem__(port, payload),
    )
    return out


@pytest.mark.parametrize(("height", "width"), [(40, 60), (300, 200), (33, 700), (700, 900)])
def test_image_patches_equal_transformers_pil_processor(ckpt, height, width):
    import io

    from omni_qwen3_omni.media import image_patches
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    data = png(height, width)
    v = ckpt.vision
    reference = Qwen2VLImageProcessorPil(
        patch_size=v.patch_size, merge_size=v.merge_size, temporal_patch_size=v.temporal_patch_size,
        min_pixels=v.min_pixels, max_pixels=v.max_pixels,
    )(images=[Image.open(io.BytesIO(data))], return_tensors="np")
    ours = image_patches(data, v)
    assert list(reference["image_grid_thw"][0]) == list(ours.grid)
    np.testing.assert_array_equal(reference["pixel_values"], ours.pixels.numpy())


def test_prompt_uses_the_checkpoints_own_template(tiny_dir, tmp_path):
    from omni_qwen3_omni.config import load_checkpoint, load_tokenizer
    from omni_qwen3_omni.prompt import render

    copy = tmp_path / "ckpt"
    shutil.copytree(tiny_dir, copy)
    template = json.loads((copy / "chat_template.json").read_text())["chat_template"]
    (copy / "chat_template.json").write_text(json.dumps({"chat_template": "{{- 'SYSTEM PREAMBLE ' -}}" + template}))
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    text = load_tokenizer(str(copy)).decode(render(load_checkpoint(str(copy)), load_tokenizer(str(copy)), messages))
    assert text == "SYSTEM PREAMBLE <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_positions_equal_transformers_rope_index(ckpt, hf_thinker):
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
        {"role": "user", "content": [
            {"type": "text", "text": "look"}, {"type": "image", "image": png(64, 96)},
            {"type": "audio", "audio": noise(2.3)}, {"type": "video", "video": mp4()},
            {"type": "image", "image": png(40, 40, seed=1)}, {"type": "text", "text": "what?"},
        ]},
    ]
    out = preprocess(ckpt, messages)
    prompt, vision = out["prompt"], out["vision"]
    ids = torch.tensor([prompt["token_ids"]])
    grids = torch.tensor(vision["grids"])
    kinds = [k for k in prompt["media"] if k != "audio"]
    images = grids[[i for i, k in enumerate(kinds) if k == "image"]]
    videos = grids[[i for i, k in enumerate(kinds) if k == "video"]]
    frames = torch.tensor([c.numel() // ckpt.audio.hop_length for c in out["audio"]["clips"]])
    expected, delta = hf_thinker.get_rope_index(
        ids, images, videos, torch.ones_like(ids), False, frames, torch.tensor([1.0])  # 2 frames at 2 fps
    )
    assert torch.equal(prompt["rope_positions"], expected[:, 0].long())
    assert prompt["rope_positions"].max() + 1 - ids.shape[1] == delta.item()
    # each media part's pad token, repeated once per encoder row, in prompt order
    t = ckpt.tokens
    pads = [tok for tok in prompt["token_ids"] if tok in (t.audio, t.image, t.video)]
    assert len(pads) == sum(g[0] * g[1] * g[2] // 4 for g in vision["grids"]) + 30  # 2.3 s of audio: 2 x 13 + 4 rows


def test_text_only_prompt_has_plain_positions(ckpt):
    out = preprocess(ckpt, [{"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "audio", "audio": noise(1)}]}])
    assert out["prompt"]["rope_positions"] is None  # audio advances one position a row: plain positions
    assert "vision" not in out and len(out["audio"]["clips"]) == 1


def test_video_frames_sampled_at_the_requested_rate(ckpt):
    from omni_qwen3_omni.media import decode_video, fitted_size, frames_patches

    def fit(w, h):
        return fitted_size(w, h, ckpt.vision, 3136, 16384)

    frames, interval = decode_video(mp4(frames=16, fps=8), fps=2.0, max_frames=64, fit=fit)
    assert len(frames) == 4 and interval == pytest.approx(0.5)  # 2 s of video: frames at 0, 0.5, 1, 1.5 s
    assert all(f.size == fit(64, 48) for f in frames)  # resized as they are decoded
    patches = frames_patches(frames, ckpt.vision, 3136, 16384)
    assert patches.grid[0] == 2  # two steps of two frames
    # 5 s at 2 frames a second is 10 frames; with at most 3 the interval doubles until they fit
    few, spread = decode_video(mp4(frames=40, fps=8), fps=2.0, max_frames=3, fit=fit)
    assert len(few) == 3 and spread == pytest.approx(2.0)


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG that claims ``width`` x ``height`` pixels and holds none (a decompression bomb's header)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


@pytest.mark.parametrize(
    ("part", "message"),
    [
        ({"type": "image", "image": b"not an image"}, "not an image"),
        ({"type": "image", "image": png(40, 40)[:60]}, "damaged"),
        ({"type": "image", "image": _png_header_only(100_000, 100_000)}, "too large"),  # Pillow's own bomb check
        ({"type": "image", "image": _png_header_only(10_000, 7_000)}, "too large"),  # ours, before decoding
        ({"type": "image", "image": png(4, 1000)}, "aspect ratio"),
        ({"type": "video", "video": b"\x00" * 1000}, "not a video"),
        ({"type": "video", "video": mp4(frames=2, size=(4112, 4112))}, "too large"),  # refused before decoding a frame
        ({"type": "audio", "audio": torch.full((16000,), float("nan"))}, "not finite"),
        ({"type": "audio", "audio": torch.zeros(200)}, "shorter than 400 samples"),  # the STFT needs a window
        ({"type": "sticker", "sticker": b""}, "not 'sticker'"),
    ],
)
def test_bad_media_is_refused_naming_the_part(ckpt, part, message):
    with pytest.raises(InvalidInput, match=message) as err:
        preprocess(ckpt, [{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}])
    assert "messages[0].content[1]" in str(err.value)


def test_part_limits_and_context(ckpt):
    images = [{"type": "image", "image": png(32, 32, seed=i)} for i in range(3)]
    with pytest.raises(InvalidInput, match="at most 2 image"):
        preprocess(ckpt, [{"role": "user", "content": images}], max_images=2)
    with pytest.raises(InvalidInput, match="the prompt takes"):
        preprocess(ckpt, [{"role": "user", "content": [{"type": "text", "text": "word " * 200}]}], max_model_len=256)
