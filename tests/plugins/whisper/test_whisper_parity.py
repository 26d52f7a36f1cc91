"""Parity with transformers' WhisperForConditionalGeneration loaded with the same weights:
the encoder, the logits, and greedy tokens (batched in our engine, one by one in transformers)."""

from __future__ import annotations

import pytest
import torch
from omni_whisper.decode_batch import DecodeBatch
from omni_whisper.decoding import LogitRules, Window
from omni_whisper.features import log_mel, split_windows
from omni_whisper.model import WhisperModel
from omni_whisper.tokenizer import WhisperTokenizer
from transformers import WhisperForConditionalGeneration


@pytest.fixture(scope="module")
def models(bundled_checkpoint, bundled_hf_dir):
    reference = WhisperForConditionalGeneration.from_pretrained(bundled_hf_dir, dtype=torch.float32).eval()
    ours = WhisperModel.from_checkpoint(bundled_checkpoint)
    tokenizer = WhisperTokenizer(bundled_checkpoint.tokenizer_dir, bundled_checkpoint.config.vocab_size)
    return reference, ours, tokenizer


def _mel(audio) -> torch.Tensor:
    return log_mel(split_windows(torch.from_numpy(audio))[0])


def _greedy_batch(ours, tokenizer, checkpoint, encoded: torch.Tensor, timestamps: bool) -> list[list[int]]:
    rules = LogitRules(tokenizer, checkpoint.suppress_ids, checkpoint.begin_suppress_ids, checkpoint.config.vocab_size)
    batch = DecodeBatch(ours, rules, capacity=len(encoded), source_positions=encoded.shape[1])
    windows = []
    for index in range(len(encoded)):
        prompt = tokenizer.prompt("en", timestamps, None, 0)
        windows.append(Window("r", index, 0.0, 30.0, prompt, timestamps, 0.0, 224))
        batch.admit(windows[-1], encoded[index])
    while len(batch):
        batch.remove(batch.step())
    return [[t for t in w.tokens if t != tokenizer.eot] for w in windows]


def test_encoder_and_first_logits_match(models, spoken_16k):
    reference, ours, tokenizer = models
    mel = _mel(spoken_16k[1])
    prompt = torch.tensor([[tokenizer.sot, tokenizer.no_timestamps]])
    with torch.inference_mode():
        expected = reference.model.encoder(mel).last_hidden_state
        encoded = ours.encoder(mel)
        torch.testing.assert_close(encoded, expected, atol=1e-4, rtol=1e-4)
        expected_logits = reference(input_features=mel, decoder_input_ids=prompt).logits[:, -1]
        logits = ours.decoder(prompt, torch.zeros(1, dtype=torch.long), ours.new_self_cache(1), ours.decoder.cross_kv(encoded))
    torch.testing.assert_close(logits, expected_logits, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("timestamps", [False, True])
def test_greedy_tokens_equal_transformers_generate(models, spoken_16k, bundled_checkpoint, timestamps):
    reference, ours, tokenizer = models
    clips = spoken_16k[1:3]
    mel = torch.cat([_mel(clip) for clip in clips])
    with torch.inference_mode():
        ours_tokens = _greedy_batch(ours, tokenizer, bundled_checkpoint, ours.encoder(mel), timestamps)
        for index in range(len(clips)):
            generated = reference.generate(mel[index : index + 1], return_timestamps=timestamps, max_new_tokens=224)
            expected = [t for t in generated[0].tolist() if t != tokenizer.eot and t not in (tokenizer.sot, tokenizer.no_timestamps)]
            assert ours_tokens[index] == expected, tokenizer.decode(expected)
    assert "coffee" in tokenizer.decode(ours_tokens[1])
