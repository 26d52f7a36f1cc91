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


def test_no_speech_probability_equals_transformers_at_the_start_of_transcript(models, spoken_16k, bundled_checkpoint):
    """The no-speech token's probability after <|startoftranscript|> (Whisper's no_speech_prob),
    taken at admission (the prompt continues past it) or at the first step (the prompt ends there),
    against transformers' logits at that position; silence gives a high one, speech a low one."""
    reference, ours, tokenizer = models
    rules = LogitRules(tokenizer, bundled_checkpoint.suppress_ids, bundled_checkpoint.begin_suppress_ids, bundled_checkpoint.config.vocab_size)
    clips = [spoken_16k[1], spoken_16k[1] * 0]
    mel = torch.cat([_mel(clip) for clip in clips])
    with torch.inference_mode():
        encoded = ours.encoder(mel)
        expected = torch.softmax(reference(input_features=mel, decoder_input_ids=torch.tensor([[tokenizer.sot]] * 2)).logits[:, 0], -1)
    batch = DecodeBatch(ours, rules, capacity=4, source_positions=encoded.shape[1])
    windows = []
    for timestamps in (False, True):  # prompts [sot, notimestamps] and [sot]
        for index in range(len(clips)):
            windows.append(Window("r", index, 0.0, 30.0, tokenizer.prompt("en", timestamps, None, 0), timestamps, 0.0, 224))
            batch.admit(windows[-1], encoded[index])
    batch.step()
    probs = [w.no_speech_prob for w in windows]
    want = expected[:, tokenizer.no_speech].tolist() * 2
    assert probs == pytest.approx(want, abs=1e-4)
    assert probs[1] > 0.6 > 0.1 > probs[0]


def test_timestamp_rules_equal_transformers_processor_row_by_row(models, bundled_checkpoint, bundled_hf_dir):
    # every branch of the rules, all rows in one batch: ours against transformers' processor on
    # each row alone (its prompt length as begin_index), with the static masks applied to both
    from transformers import GenerationConfig
    from transformers.generation.logits_process import WhisperTimeStampLogitsProcessor

    _, _, tokenizer = models
    rules = LogitRules(tokenizer, bundled_checkpoint.suppress_ids, bundled_checkpoint.begin_suppress_ids, bundled_checkpoint.config.vocab_size)
    ts, text = tokenizer.timestamp_begin, 1000
    histories = [[], [ts + 3], [ts + 3, text], [ts + 3, text, ts + 40], [ts + 3, text, ts + 40, ts + 40], [ts, text, text + 1], [text]]
    prompt = tokenizer.prompt("en", True, None, 0)
    windows = [Window("r", i, 0.0, 30.0, prompt, True, 0.0, 224, tokens=list(h)) for i, h in enumerate(histories)]
    windows.insert(3, Window("r", 99, 0.0, 30.0, tokenizer.prompt("en", False, None, 0), False, 0.0, 224, tokens=[text]))
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(len(windows), bundled_checkpoint.config.vocab_size, generator=generator) * 3
    logits[6, ts:] += 8  # a row whose timestamps outweigh its text (after the inserted row): text gets banned
    before = logits.clone()
    rules.apply(logits, windows)  # on CPU row by row; a GPU takes every row at once, checked here too
    batched = before.masked_fill(torch.stack([rules.with_timestamp_mask if w.timestamps else rules.no_timestamp_mask for w in windows])
                                 | (rules.begin & torch.tensor([not w.tokens for w in windows])[:, None]), float("-inf"))
    stamped = [i for i, w in enumerate(windows) if w.timestamps]
    only_stamped = batched[stamped]  # (a copy: every row of it has timestamps, the path without gather and scatter)
    rules._batch_timestamp_rules(batched, stamped, windows)
    assert torch.equal(batched, logits)
    rules._batch_timestamp_rules(only_stamped, list(range(len(stamped))), [windows[i] for i in stamped])
    assert torch.equal(only_stamped, logits[stamped]) and not torch.equal(only_stamped, before[stamped])
    processor = WhisperTimeStampLogitsProcessor(GenerationConfig.from_pretrained(bundled_hf_dir), begin_index=len(prompt))
    for row, window in enumerate(windows):
        static = rules.with_timestamp_mask if window.timestamps else rules.no_timestamp_mask
        expected = before[row : row + 1].masked_fill(static | (rules.begin & (not window.tokens)), float("-inf"))
        if window.timestamps:
            expected = processor(torch.tensor([window.prompt + window.tokens]), expected)
        assert torch.equal(logits[row : row + 1].isinf(), expected.isinf()), (row, window.tokens)
        assert torch.equal(logits[row : row + 1], expected), (row, window.tokens)
    assert logits[6, :ts].isinf().all() and not before[6, :ts].isinf().any()
