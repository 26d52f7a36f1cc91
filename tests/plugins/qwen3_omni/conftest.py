"""Shared fixtures: the tiny Qwen3-Omni checkpoint (and one whose special tokens sit at other
ids), transformers' model on the same weights, media made here (PNG, WAV, MP4), and a server of
the tiny preset with the `openai` client on it."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
import torch

from tests.helpers.browser import browser, page  # noqa: F401 - the playground's fixtures
from tests.helpers.hf_models import one_torch_thread  # noqa: F401 - autouse fixture

LIMITS = dict(
    max_audios=8, max_images=8, max_videos=2, video_fps=2.0, video_max_frames=8,
    video_min_pixels=3136, video_max_pixels=16384, max_model_len=4096,
)


def _write(path, **kwargs) -> str:
    from omni_qwen3_omni.presets import write_tiny

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return write_tiny(str(path), **kwargs)
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def omni_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("qwen3-omni-cache")


@pytest.fixture(scope="session")
def tiny_dir(omni_cache):
    # where `omni serve --preset tiny` puts it with OMNI_CACHE=omni_cache: servers reuse it
    return _write(omni_cache / "presets" / "qwen3-omni" / "tiny")


@pytest.fixture(scope="session")
def reordered_dir(tmp_path_factory):
    """Special tokens first, in another order: no special id is where the tiny preset has it."""
    from omni_qwen3_omni.presets import SPECIAL_TOKENS

    order = list(reversed(SPECIAL_TOKENS))
    return _write(tmp_path_factory.mktemp("qwen3-omni-reordered"), special_order=order, seed=1)


@pytest.fixture(scope="session")
def hf_thinker(tiny_dir):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_dir, dtype=torch.float32).eval().thinker


def png(height: int, width: int, seed: int = 0) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def mp4(frames: int = 16, fps: int = 8, size: tuple[int, int] = (64, 48), seed: int = 0) -> bytes:
    import av

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
        for _ in range(frames):
            pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def noise(seconds: float, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy((np.random.default_rng(seed).standard_normal(int(seconds * 16000)) * 0.1).astype(np.float32))


def wav(samples: torch.Tensor, rate: int = 16000) -> bytes:
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, samples.numpy(), rate, format="WAV")
    return buf.getvalue()


@contextlib.contextmanager
def tiny_server(omni_cache, workdir, *options: str, **env: str):
    """`omni serve --family qwen3-omni --preset tiny` with ``--option`` values, on loopback;
    ``env`` adds variables (OMNI_API_KEY)."""
    from tests.helpers.server import OmniServer

    args = [arg for option in options for arg in ("--option", option)]
    proc = OmniServer(
        "qwen3-omni", workdir, "--preset", "tiny", *args, OMNI_PLUGINS="qwen3-omni", OMNI_CACHE=str(omni_cache), **env
    )
    try:
        proc.wait_ready(timeout_s=180)
        yield proc
    finally:
        proc.stop()


def openai_client(server):
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
