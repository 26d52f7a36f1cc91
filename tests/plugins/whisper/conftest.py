"""Shared fixtures: English sentences spoken by espeak-ng (real speech for the real tiny.en
weights), and the bundled checkpoint converted once per session."""

from __future__ import annotations

import io
import shutil
import subprocess

import numpy as np
import pytest
import soundfile as sf
import soxr

from tests.helpers.browser import browser, page  # noqa: F401 - the playground's fixtures

SENTENCES = [
    "The weather today is sunny and warm.",
    "Please send me the report by Friday morning.",
    "I would like a cup of coffee with milk.",
    "The meeting has been moved to three o'clock.",
    "She reads a book every night before bed.",
    "We are going to the park this afternoon.",
    "The train to London leaves at nine.",
    "Can you help me carry these boxes upstairs?",
    "My brother works as a teacher in a small town.",
    "Thank you very much for your kind invitation.",
    "The children played football in the garden.",
    "Turn off the lights when you leave the room.",
]
# An American voice at 160 words per minute with 40 ms between words.
ESPEAK_ARGS = ["-v", "en-us", "-s", "160", "-g", "4"]


def speak(text: str) -> bytes:
    """WAV bytes (22050 Hz) of ``text`` spoken by espeak-ng."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (scripts set it up on fresh machines)")
    return subprocess.run(["espeak-ng", *ESPEAK_ARGS, "--stdout", text], capture_output=True, check=True).stdout


def to_16k(wav: bytes) -> np.ndarray:
    samples, rate = sf.read(io.BytesIO(wav), dtype="float32")
    return soxr.resample(samples, rate, 16000).astype(np.float32)


@pytest.fixture(scope="session")
def sentences() -> list[str]:
    return list(SENTENCES)


@pytest.fixture(scope="session")
def spoken() -> list[bytes]:
    return [speak(sentence) for sentence in SENTENCES]


@pytest.fixture(scope="session")
def bundled_checkpoint():
    from omni_whisper.checkpoint import bundled_model_dir, load_checkpoint

    return load_checkpoint(bundled_model_dir())


@pytest.fixture(scope="session")
def bundled_hf_dir(bundled_checkpoint, tmp_path_factory):
    """The bundled weights converted to the Hugging Face layout (what transformers loads)."""
    from omni_whisper.checkpoint import write_hf_checkpoint

    return write_hf_checkpoint(bundled_checkpoint, tmp_path_factory.mktemp("whisper-hf"))


@pytest.fixture(scope="session")
def spoken_16k(spoken) -> list[np.ndarray]:
    return [to_16k(wav) for wav in spoken]
