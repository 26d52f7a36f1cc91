"""The frontend on the tiny checkpoint: the prompt's ChatML turns, the cloning prompt's reference
frames, text normalisation, and refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omni_core.hooks import InvalidInput
from omni_fish_s2pro.codec_checkpoint import load_codec
from omni_fish_s2pro.config import load_tokenizer, token_ids
from omni_fish_s2pro.frontend import Frontend
from omni_fish_s2pro.text_normalize import normalize_text


@pytest.fixture(scope="module")
def frontend(tiny_dir):
    return Frontend(load_tokenizer(tiny_dir), token_ids(tiny_dir, 64), load_codec(tiny_dir))


def _text(frontend, ids) -> str:
    return frontend.tokenizer.decode(ids, skip_special_tokens=False)


def test_the_plain_prompt_is_three_chatml_turns(frontend):
    prompt = frontend.prompt({"text": "  Hello there.  "})
    assert _text(frontend, prompt.token_ids) == (
        "<|im_start|>system\nconvert the provided text to speech<|im_end|>\n"
        "<|im_start|>user\nHello there.<|im_end|>\n<|im_start|>assistant\n<|voice|>"
    )
    assert prompt.frames.shape == (10, 0)


def test_the_cloning_prompt_holds_the_transcript_and_the_reference_frames(frontend):
    rate = 22050
    audio = (np.sin(np.arange(rate) / 5.0) * 0.3).astype(np.float32)  # one second at another rate
    prompt = frontend.prompt(
        {
            "text": "Hi.",
            "reference_audio": torch.from_numpy(audio),
            "reference_sample_rate": rate,
            "reference_text": "A tone’s sound.",
        }
    )
    frames = prompt.frames
    assert frames.shape == (10, 22)  # 44100 samples after resampling: 22 frames of 2048
    ids = torch.tensor(prompt.token_ids)
    semantic = ids[(ids >= frontend.ids.semantic_begin) & (ids <= frontend.ids.semantic_end)]
    assert torch.equal(semantic - frontend.ids.semantic_begin, frames[0])
    text = _text(
        frontend,
        [t for t in prompt.token_ids if not frontend.ids.semantic_begin <= t <= frontend.ids.semantic_end],
    )
    assert text.startswith(
        "<|im_start|>system\nconvert the provided text to speech reference to the following:\n\nText:\n"
        "<|speaker:0|>A tone's sound.\n\nSpeech:\n<|im_end|>\n"
    )
    tagged = frontend.prompt(
        {
            "text": "Hi.",
            "reference_audio": torch.from_numpy(audio),
            "reference_sample_rate": rate,
            "reference_text": "<|speaker:1|>x",
        }
    )
    assert "<|speaker:0|>" not in _text(frontend, tagged.token_ids)
    assert torch.equal(tagged.frames, frames)  # the same recording: its codes again (cached)


def test_normalisation_and_refusals(frontend):
    assert normalize_text(" It’s fine,,, really 😀 ") == "It's fine, really"
    with pytest.raises(InvalidInput, match="nothing to speak"):
        frontend.prompt({"text": "😀😀"})
    with pytest.raises(InvalidInput, match="control token"):
        frontend.prompt({"text": "a <|semantic:3|> b"})
    with pytest.raises(InvalidInput, match="reference audio must last 0.5-30 s"):
        frontend.prompt({"text": "Hi.", "reference_audio": torch.zeros(1000), "reference_sample_rate": 16000})
    with pytest.raises(InvalidInput, match="unknown voice"):
        frontend.prompt({"text": "Hi.", "voice": "alloy"})
