"""Shared fixtures: one tiny S2-Pro checkpoint per session, in the place `omni serve --preset
tiny` uses (OMNI_CACHE/presets/fish-s2pro/tiny), and speech made with espeak-ng."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import soundfile as sf


@pytest.fixture(scope="session")
def omni_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("fish-s2pro-cache")


@pytest.fixture(scope="session")
def tiny_dir(omni_cache):
    from omni_fish_s2pro.presets import write_tiny

    return write_tiny(str(omni_cache / "presets" / "fish-s2pro" / "tiny"))


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """(samples, rate, transcript, wav path) of a short espeak-ng recording."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    text = "The birch canoe slid on the smooth planks."
    path = tmp_path_factory.mktemp("reference") / "reference.wav"
    subprocess.run(
        ["espeak-ng", "-v", "en-us", "-s", "160", "-w", str(path), text], check=True, capture_output=True
    )
    audio, rate = sf.read(str(path), dtype="float32")
    return np.asarray(audio, dtype=np.float32), rate, text, path


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core machine the thread
    pool's spinning makes them many times slower: run these tests on one thread."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
