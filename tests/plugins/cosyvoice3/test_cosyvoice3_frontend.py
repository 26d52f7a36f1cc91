"""The frontend on espeak-ng speech: features against reference implementations, the ONNX models
through onnxruntime, prompt assembly, and clear errors for bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omni_cosyvoice3.checkpoint import load_speakers
from omni_cosyvoice3.features import kaldi_fbank, prompt_mel, resample, whisper_log_mel
from omni_cosyvoice3.frontend import Frontend, InvalidInput
from omni_cosyvoice3.text_tokenizer import ENDOFPROMPT
from transformers import WhisperFeatureExtractor


@pytest.fixture(scope="module")
def frontend(tiny_dir):
    return Frontend(tiny_dir, load_speakers(tiny_dir))


def test_whisper_log_mel_matches_transformers(reference):
    audio, rate, _, _ = reference
    audio16 = resample(audio, rate, 16000)
    expected = WhisperFeatureExtractor(feature_size=128)(
        audio16, sampling_rate=16000, return_tensors="np", padding="longest"
    ).input_features[0]
    ours = whisper_log_mel(audio16)
    assert ours.shape == (128, len(audio16) // 160)
    np.testing.assert_allclose(ours, expected[:, : ours.shape[1]], atol=1e-5)


def test_feature_shapes(reference):
    audio, rate, _, _ = reference
    audio24, audio16 = resample(audio, rate, 24000), resample(audio, rate, 16000)
    mel = prompt_mel(audio24)
    assert mel.shape == (len(audio24) // 480, 80) and torch.isfinite(mel).all()
    fbank = kaldi_fbank(audio16)
    assert fbank.shape == (1 + (len(audio16) - 400) // 160, 80)
    np.testing.assert_allclose(fbank.mean(axis=0), 0, atol=1e-4)


def test_reference_prompt(frontend, reference):
    audio, rate, text, _ = reference
    tokens, mel, embedding = frontend.reference(audio, rate)
    seconds = len(audio) / rate
    assert abs(len(tokens) - 25 * seconds) <= 2  # 25 Hz speech tokens
    assert all(0 <= t < 6561 for t in tokens)
    assert mel.shape == (2 * len(tokens), 80) and embedding.shape == (192,)

    cloned = frontend.prepare(
        {"text": "Say this.", "reference_audio": audio, "reference_sample_rate": rate, "reference_text": text}
    )
    assert cloned.llm_prompt_tokens == tokens and cloned.flow_prompt_tokens == tokens
    assert frontend.tokenizer.endofprompt_id in cloned.text_ids
    assert cloned.text_ids[-cloned.target_text_len :] == frontend.tokenizer.encode("Say this.")
    no_text = frontend.prepare({"text": "Say this.", "reference_audio": audio, "reference_sample_rate": rate})
    assert no_text.llm_prompt_tokens == [] and no_text.flow_prompt_tokens == tokens  # cross-lingual mode
    instructed = frontend.prepare(
        {
            "text": "Say this.",
            "reference_audio": audio,
            "reference_sample_rate": rate,
            "reference_text": text,
            "instructions": "Speak slowly.",
        }
    )
    assert instructed.llm_prompt_tokens == []
    prompt = frontend.tokenizer.tokenizer.decode(instructed.text_ids)
    assert "Speak slowly." in prompt and ENDOFPROMPT in prompt
    builtin = frontend.prepare({"text": "Say this.", "voice": "default"})
    assert builtin.flow_prompt_tokens == [] and builtin.embedding.shape == (192,)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"text": ""}, "text must be a non-empty string"),
        ({"text": "hi", "voice": "nobody"}, "unknown voice 'nobody'"),
        (
            {
                "text": "hi",
                "reference_audio": np.zeros(16000, dtype=np.float32),
                "reference_sample_rate": 100,
            },
            "reference audio must last 0.2-30 s at 8000-192000 Hz; this one is sampled at 100 Hz",
        ),
        (
            {
                "text": "hi",
                "reference_audio": np.zeros((2, 16000), dtype=np.float32),
                "reference_sample_rate": 16000,
            },
            "mono",
        ),
        (
            {
                "text": "hi",
                "reference_audio": np.full(16000, np.nan, dtype=np.float32),
                "reference_sample_rate": 16000,
            },
            "NaN",
        ),
        (
            {
                "text": "hi",
                "reference_audio": np.zeros(16000 * 31, dtype=np.float32),
                "reference_sample_rate": 16000,
            },
            "must last",
        ),
    ],
)
def test_bad_input_is_refused_clearly(frontend, payload, message):
    with pytest.raises(InvalidInput, match=message):
        frontend.prepare(payload)


def test_a_reference_past_full_scale_is_encoded_as_the_same_recording_at_full_scale(frontend, reference):
    audio, rate, _, _ = reference
    audio = np.asarray(audio, dtype=np.float32)
    peak = np.abs(audio).max()
    loud = audio / peak * np.float32(1e30)  # a float file far past full scale: its log-mels overflowed
    tokens, mel, embedding = frontend.reference(loud, rate)
    assert all(0 <= t < 6561 for t in tokens) and torch.isfinite(mel).all() and torch.isfinite(embedding).all()
    full_tokens, full_mel, _ = frontend.reference(audio / peak, rate)  # the same up to float rounding
    assert len(tokens) == len(full_tokens) and np.mean(np.equal(tokens, full_tokens)) > 0.9
    assert torch.allclose(mel, full_mel, atol=1e-3)


def test_a_recording_is_encoded_once_and_then_reused(tiny_dir, reference):
    audio, rate, _, _ = reference
    frontend = Frontend(tiny_dir, load_speakers(tiny_dir))  # its own cache
    first = frontend.reference(audio, rate)
    again = frontend.reference(np.array(audio, copy=True), rate)  # the same samples in another array
    assert (frontend.reference_misses, frontend.reference_hits) == (1, 1)
    assert again[0] == first[0] and torch.equal(again[1], first[1]) and torch.equal(again[2], first[2])
    again[0].append(-1)  # a caller's list is its own
    assert frontend.reference(audio, rate)[0] == first[0]
    quieter = frontend.reference(audio * 0.5, rate)  # other samples: encoded anew
    assert frontend.reference_misses == 2 and not torch.equal(quieter[1], first[1])
    frontend.reference(audio, rate // 2)  # the same samples at another rate: anew
    assert frontend.reference_misses == 3


def test_saved_zero_shot_speaker_in_spk2info(frontend, reference):
    # the official spk2info.pt entry of a zero-shot speaker: prompt text as ids, tokens, feat, embeddings
    audio, rate, text, _ = reference
    tokens, mel, embedding = frontend.reference(audio, rate)
    prompt_ids = frontend.tokenizer.encode(f"You are a helpful assistant.{ENDOFPROMPT}{text}")
    entry = {
        "prompt_text": torch.tensor([prompt_ids]),
        "llm_prompt_speech_token": torch.tensor([tokens]),
        "flow_prompt_speech_token": torch.tensor([tokens]),
        "prompt_speech_feat": mel[None],
        "llm_embedding": embedding[None],
        "flow_embedding": embedding[None],
    }
    saved = Frontend.__new__(Frontend)
    saved.__dict__.update(frontend.__dict__, speakers={"birch": entry})
    prepared = saved.prepare({"text": "Say this.", "voice": "birch"})
    assert prepared.text_ids == prompt_ids + frontend.tokenizer.encode("Say this.")
    assert prepared.llm_prompt_tokens == tokens and prepared.flow_prompt_tokens == tokens
    assert torch.equal(prepared.prompt_mel, mel) and torch.equal(prepared.embedding, embedding)
