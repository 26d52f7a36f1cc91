"""Shared fixtures: one tiny CosyVoice3 checkpoint per session, in the layout `omni serve
--preset tiny` uses (OMNI_CACHE/presets/cosyvoice3/tiny), and speech made with espeak-ng."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import soundfile as sf

from tests.helpers.browser import browser, keyless_page, page  # noqa: F401 - the playground's fixtures


@pytest.fixture(scope="session")
def omni_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cosyvoice3-cache")


@pytest.fixture(scope="session")
def tiny_dir(omni_cache):
    import torch
    from omni_cosyvoice3.presets import write_tiny

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return write_tiny(str(omni_cache / "presets" / "cosyvoice3" / "tiny"))
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def flow(tiny_dir):
    from omni_cosyvoice3.checkpoint import load_flow

    return load_flow(tiny_dir)


@pytest.fixture(scope="session")
def hift(tiny_dir):
    from omni_cosyvoice3.checkpoint import load_hift

    return load_hift(tiny_dir)


def espeak(text: str, path) -> tuple[np.ndarray, int]:
    """Synthesise ``text`` with espeak-ng into ``path`` (wav); returns (float32 samples, rate)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    subprocess.run(
        ["espeak-ng", "-v", "en-us", "-s", "160", "-w", str(path), text], check=True, capture_output=True
    )
    audio, rate = sf.read(str(path), dtype="float32")
    return audio, rate


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """(samples, rate, transcript, wav path) of a short espeak-ng recording."""
    text = "The birch canoe slid on the smooth planks."
    path = tmp_path_factory.mktemp("reference") / "reference.wav"
    audio, rate = espeak(text, path)
    return audio, rate, text, path


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core machine the thread
    pool's spinning makes them many times slower: run these tests on one thread."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
