"""Images and videos as the vision encoder reads them, made as the Qwen2-VL processors make them.

Images: decoded by Pillow, converted to RGB, resized (bicubic) so both sides are multiples of
``patch_size * merge_size`` and the pixel count lies within [min_pixels, max_pixels] (aspect
kept as closely as it can be), scaled to [0, 1], normalised by the checkpoint's mean and std,
and cut into patches of ``temporal_patch_size`` frames (an image repeats its one frame) in
spatial-merge-block order. Videos: frames decoded by PyAV, sampled at ``fps`` frames a second,
resized alike (their own pixel bounds), cut into patches of ``temporal_patch_size`` consecutive
frames (the last frame repeated to fill the last step).
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .config import VisionSettings

MAX_IMAGE_PIXELS = 64_000_000  # refused before decoding: larger pictures are resized down anyway


class MediaError(ValueError):
    """Content that is not a usable image or video: the message says why."""


@dataclass
class Patches:
    pixels: torch.Tensor  # [t * h * w, 3 * temporal_patch * patch * patch] float32
    grid: tuple[int, int, int]  # (t, h, w) in patches


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Sides that are multiples of ``factor``, about the same aspect, pixels within the bounds."""
    if max(height, width) / min(height, width) > 200:
        raise MediaError(f"aspect ratio {max(height, width) / min(height, width):.0f}:1 is too extreme (at most 200:1)")
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def decode_image(data: bytes):
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError:
        raise MediaError(f"the image is too large (at most {MAX_IMAGE_PIXELS} pixels)") from None
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise MediaError(f"not an image Pillow can read ({type(exc).__name__})") from None
    width, height = image.size
    if width * height > MAX_IMAGE_PIXELS:
        raise MediaError(f"the image is too large: {width}x{height} pixels (at most {MAX_IMAGE_PIXELS})")
    if width < 1 or height < 1:
        raise MediaError("the image is empty")
    try:
        image.load()
    except (OSError, ValueError) as exc:
        raise MediaError(f"the image data is damaged ({type(exc).__name__})") from None
    return image


def image_patches(data: bytes, settings: VisionSettings) -> Patches:
    image = decode_image(data).convert("RGB")
    return frames_patches([image], settings, settings.min_pixels, settings.max_pixels)


def fitted_size(width: int, height: int, settings: VisionSettings, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(width, height) a picture of this size is resized to (``smart_resize``)."""
    h, w = smart_resize(height, width, settings.patch_size * settings.merge_size, min_pixels, max_pixels)
    return w, h


def frames_patches(frames: list, settings: VisionSettings, min_pixels: int, max_pixels: int) -> Patches:
    """PIL frames of one image or video -> patches; a video's frames share the first frame's size."""
    from PIL import Image

    w, h = fitted_size(*frames[0].size, settings, min_pixels, max_pixels)
    arrays = []
    mean = np.asarray(settings.image_mean, dtype=np.float32)[:, None, None]
    std = np.asarray(settings.image_std, dtype=np.float32)[:, None, None]
    for frame in frames:
        resized = frame.resize((w, h), resample=Image.BICUBIC) if frame.size != (w, h) else frame
        # scaled in float64 and stored as float32, then normalised in float32: the reference's rounding
        pixels = (np.asarray(resized).transpose(2, 0, 1).astype(np.float64) * (1 / 255)).astype(np.float32)
        arrays.append((pixels - mean) / std)
    return patchify(np.stack(arrays), settings)


def patchify(frames: np.ndarray, settings: VisionSettings) -> Patches:
    """[F, 3, H, W] normalised frames -> patches in (step, merge block row, column, row in block,
    column in block) order, each flattened as (channel, frame in step, pixel row, pixel column)."""
    tp, p, m = settings.temporal_patch_size, settings.patch_size, settings.merge_size
    if len(frames) % tp:  # the last step is filled with copies of the last frame
        frames = np.concatenate([frames, np.repeat(frames[-1:], tp - len(frames) % tp, axis=0)])
    f, c, height, width = frames.shape
    t, gh, gw = f // tp, height // p, width // p
    x = frames.reshape(t, tp, c, gh // m, m, p, gw // m, m, p)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)  # t, bh, bw, mh, mw, c, tp, ph, pw
    pixels = np.ascontiguousarray(x.reshape(t * gh * gw, c * tp * p * p))
    return Patches(torch.from_numpy(pixels), (t, gh, gw))


MAX_VIDEO_FRAMES_DECODED = 20_000  # about 11 minutes at 30 frames a second
MAX_FRAME_PIXELS = 4096 * 4096  # per decoded frame, checked before decoding


def decode_video(data: bytes, fps: float, max_frames: int, fit: Callable[[int, int], tuple[int, int]]) -> tuple[list, float]:
    """Frames sampled at ``fps`` (the first decoded at or after each sampling time) and the seconds
    between them. A video longer than ``max_frames`` at ``fps`` keeps every other frame, and so
    on (the interval doubling each time), so at most ``max_frames`` frames are ever held, each
    resized at once to ``fit(width, height)``: memory stays bounded whatever the video's length
    and size."""
    try:
        import av
    except ImportError:
        raise MediaError("video input needs PyAV (pip install av)") from None
    from PIL import Image

    interval = 1.0 / fps
    kept: list[tuple[float, object]] = []
    target = None  # the frame size every kept frame is resized to
    next_time = None
    try:
        with av.open(io.BytesIO(data)) as container:
            stream = next((s for s in container.streams if s.type == "video"), None)
            if stream is None:
                raise MediaError("the file holds no video stream")
            _check_frame_size(stream.codec_context.width, stream.codec_context.height)
            for decoded, frame in enumerate(container.decode(stream)):
                if decoded >= MAX_VIDEO_FRAMES_DECODED:
                    raise MediaError(f"the video has more than {MAX_VIDEO_FRAMES_DECODED} frames")
                if frame.time is None or (next_time is not None and frame.time < next_time):
                    continue
                _check_frame_size(frame.width, frame.height)
                target = target or fit(frame.width, frame.height)
                image = frame.to_image().convert("RGB")
                kept.append((float(frame.time), image if image.size == target else image.resize(target, resample=Image.BICUBIC)))
                if len(kept) > max_frames:
                    kept, interval = kept[::2], interval * 2
                next_time = kept[-1][0] + interval - 1e-6
    except MediaError:
        raise
    except Exception as exc:  # PyAV raises its own error types for anything it cannot decode
        raise MediaError(f"not a video PyAV can decode ({type(exc).__name__})") from None
    if not kept:
        raise MediaError("the video has no frames")
    return [image for _, image in kept], interval


def _check_frame_size(width: int, height: int) -> None:
    if width * height > MAX_FRAME_PIXELS:
        raise MediaError(f"video frames of {width}x{height} pixels are too large (at most {MAX_FRAME_PIXELS} pixels)")
