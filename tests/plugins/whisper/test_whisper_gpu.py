"""Whisper on a CUDA device: the pipeline (encoder batches and decoder rows on the GPU) against
transformers' Whisper on the same GPU and weights (the tiny presets), float32, token for token.
The clips are noise and tones: GPU machines need neither espeak-ng nor the bundled weights."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from omni_core.api import Omni
from omni_whisper.features import log_mel, split_windows
from omni_whisper.presets import write_tiny, write_tiny_multilingual
from omni_whisper.tokenizer import WhisperTokenizer
from transformers import WhisperForConditionalGeneration

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _clips() -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    t = np.arange(16000 * 4) / 16000
    tones = [(0.3 * np.sin(2 * np.pi * f * t)).astype(np.float32) for f in (220.0, 440.0, 880.0)]
    noise = [(0.1 * rng.standard_normal(16000 * s)).astype(np.float32) for s in (3, 2, 5)]
    return [*noise, *tones]


def _mel(audio: np.ndarray) -> torch.Tensor:
    return log_mel(split_windows(torch.from_numpy(audio))[0]).cuda()


@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_pipeline_on_cuda_equals_transformers_and_batches(tmp_path, cuda_graphs):
    path = write_tiny(str(tmp_path / "tiny"))
    reference = WhisperForConditionalGeneration.from_pretrained(path, dtype=torch.float32).cuda().eval()
    tokenizer = WhisperTokenizer(path, reference.config.vocab_size)
    clips = _clips()
    options = {"dtype": "float32", "cuda_graphs": cuda_graphs, "max_batch": 8}  # six rows at once: the caches grow past 4
    with Omni(family="whisper", model=path, device="cuda", options=options) as omni:
        alone = [omni.transcribe(clip, 16000).text for clip in clips]
        with ThreadPoolExecutor(len(clips)) as pool:  # decoded in one batch of rows
            together = list(pool.map(lambda clip: omni.transcribe(clip, 16000).text, clips))
        decoder = omni.stats()["stages"]["decoder"]
    assert together == alone
    assert (decoder["graph_replays"] == decoder["steps"] > 0) if cuda_graphs else decoder["graph_replays"] == 0
    for clip, text in zip(clips, alone, strict=True):
        with torch.inference_mode():
            expected = reference.generate(_mel(clip), max_new_tokens=224)[0].tolist()
        assert text == tokenizer.decode(expected).strip()


def test_timestamped_rows_on_cuda_batch_like_alone(tmp_path):
    # rows with timestamps take the rules' batched path on a GPU (test_whisper_parity.py checks it
    # against transformers' processor): six at once decode as each alone, into well-formed segments
    path = write_tiny(str(tmp_path / "tiny"))
    clips = _clips()
    with Omni(family="whisper", model=path, device="cuda", options={"dtype": "float32", "max_batch": 8}) as omni:
        alone = [omni.transcribe(clip, 16000, timestamps=True).segments for clip in clips]
        with ThreadPoolExecutor(len(clips)) as pool:
            together = list(pool.map(lambda clip: omni.transcribe(clip, 16000, timestamps=True).segments, clips))
    def timed_text(segments):
        return [(s["start"], s["end"], s["text"]) for s in segments]

    assert [timed_text(s) for s in together] == [timed_text(s) for s in alone]
    for batched, single in zip(together, alone, strict=True):  # log-probabilities: to the batch's rounding
        for key in ("avg_logprob", "no_speech_prob"):
            assert [s[key] for s in batched] == pytest.approx([s[key] for s in single], abs=1e-3)
    for clip, segments in zip(clips, alone, strict=True):
        assert segments and all(0.0 <= s["start"] <= s["end"] <= len(clip) / 16000 for s in segments)


def test_word_timestamps_on_cuda(tmp_path):
    # the alignment heads' weights come off the device for the warping
    path = write_tiny(str(tmp_path / "tiny"))
    clip = _clips()[3]  # a 4 s tone
    with Omni(family="whisper", model=path, device="cuda", options={"dtype": "float32"}) as omni:
        result = omni.transcribe(clip, 16000, word_timestamps=True)
    words = [w for s in result.segments for w in s.get("words", [])]
    assert words and [w["word"] for w in words] == result.text.split()
    assert all(0.0 <= w["start"] <= w["end"] <= 4.0 for w in words)


def test_language_detection_and_translation_on_cuda(tmp_path):
    path = write_tiny_multilingual(str(tmp_path / "tiny-multilingual"))
    reference = WhisperForConditionalGeneration.from_pretrained(path, dtype=torch.float32).cuda().eval()
    tokenizer = WhisperTokenizer(path, reference.config.vocab_size)
    clip = _clips()[0]  # noise
    with Omni(family="whisper", model=path, device="cuda", options={"dtype": "float32"}) as omni:
        result = omni.translate(clip, 16000)
    with torch.inference_mode():
        language = int(reference.detect_language(_mel(clip))[0])
        expected = reference.generate(_mel(clip), task="translate", max_new_tokens=224)[0].tolist()
    assert tokenizer.languages[result.language] == language
    assert result.text == tokenizer.decode(expected).strip()
