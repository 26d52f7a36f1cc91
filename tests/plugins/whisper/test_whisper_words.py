"""Word timestamps (``timing.py``) on the real tiny.en weights and espeak-ng speech: the
alignment machinery (standardisation, median filter, time warping) gives transformers' token
timestamps on the same weights, and words line up with the transcript and with where the speech
is in the audio."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from omni_core.api import Omni
from omni_core.pipeline import RequestFailed
from omni_whisper import timing
from omni_whisper.checkpoint import bundled_model_dir
from omni_whisper.decode_batch import DecodeBatch
from omni_whisper.decoding import Window
from omni_whisper.features import log_mel, split_windows
from omni_whisper.presets import write_tiny
from omni_whisper.stages import DecoderWorker
from omni_whisper.timing import alignment_weights, token_times
from transformers import WhisperForConditionalGeneration

from tests.plugins.whisper.conftest import speak, to_16k

LEAD, TAIL = 1.0, 0.5  # seconds of silence around the sentence


@pytest.fixture(scope="module")
def padded(spoken_16k) -> list[tuple[np.ndarray, float]]:
    """(audio, where its speech ends) for three sentences with silence before and after."""
    out = []
    for speech in spoken_16k[2:5]:
        silence = np.zeros(int(16000 * LEAD), np.float32)
        out.append((np.concatenate([silence, speech, silence[: int(16000 * TAIL)]]), LEAD + len(speech) / 16000))
    return out


def _words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()


def test_token_times_equal_transformers(bundled_hf_dir, padded):
    reference = WhisperForConditionalGeneration.from_pretrained(bundled_hf_dir, dtype=torch.float32).eval()
    worker = DecoderWorker(str(bundled_model_dir()), "float32")
    tok = worker.tokenizer
    for audio, _ in padded:
        frames = int(len(audio) / 16000 * 100)
        mel = log_mel(split_windows(torch.from_numpy(audio))[0])
        mask = torch.zeros(1, mel.shape[-1], dtype=torch.long)
        mask[0, :frames] = 1
        with torch.inference_mode():
            out = reference.generate(mel, return_token_timestamps=True, attention_mask=mask, max_new_tokens=224)
            encoded = worker.model.encoder(mel)[0]
        text = [t for t in out["sequences"][0].tolist() if t < tok.eot]
        prompt = [tok.sot, tok.no_timestamps]
        # transformers' rows: the queries where each text token is fed
        weights = alignment_weights(worker.model, encoded, [*prompt, *text], worker.alignment_heads)[:, len(prompt) :]
        expected = out["token_timestamps"][0, : len(text)].numpy()
        np.testing.assert_allclose(token_times(weights, frames), expected, atol=1e-6)


def test_alignment_from_the_batch_row_equals_the_one_computed_again(padded):
    # a finished window's alignment is taken from its row of the decode batch (its cross K/V
    # computed once, at admission): the same weights as from the encoder output again
    worker = DecoderWorker(str(bundled_model_dir()), "float32")
    tok = worker.tokenizer
    audio, _ = padded[0]
    with torch.inference_mode():
        encoded = worker.model.encoder(log_mel(split_windows(torch.from_numpy(audio))[0]))
    batch = DecodeBatch(worker.model, worker.rules, capacity=2, source_positions=encoded.shape[1])
    window = Window("r", 0, 0.0, len(audio) / 16000, tok.prompt("en", False, None, 0), False, 0.0, 224)
    batch.admit(Window("other", 0, 0.0, 1.0, tok.prompt("en", False, None, 0), False, 0.0, 3), encoded[0] * 0.5)
    batch.admit(window, encoded[0])
    while window.tokens[-1:] != [tok.eot]:
        batch.step()
    row = batch.windows.index(window)
    taken = worker.alignment(window, [(k[row : row + 1], v[row : row + 1]) for k, v in batch.cross_kv])
    text = [t for t in window.tokens if t < tok.eot]
    assert window.prompt[-1] == tok.no_timestamps  # (the prompt word timing aligns after)
    again = alignment_weights(worker.model, encoded[0], [*window.prompt, *text], worker.alignment_heads)
    assert taken is not None and torch.equal(taken, again)


@pytest.mark.skipif(timing._native_path() is None, reason="no C compiler on this machine")
def test_the_c_path_and_the_sorting_network_equal_their_numpy_and_torch_forms():
    # the C dynamic time warping gives numpy's path, ties included (integer costs tie often);
    # the median filter's min/max network gives torch's median over each window exactly
    rng = np.random.default_rng(0)
    for trial in range(30):
        rows, cols = int(rng.integers(1, 60)), int(rng.integers(1, 300))
        cost = rng.integers(-2, 3, (rows, cols)).astype(np.float64) if trial % 2 else rng.standard_normal((rows, cols))
        ours, reference = timing.monotonic_path(cost), timing.monotonic_path_numpy(cost)
        assert np.array_equal(ours[0], reference[0]) and np.array_equal(ours[1], reference[1])
    x = torch.randn(3, 20, 300)
    padded = torch.nn.functional.pad(x.reshape(-1, 1, 300), (3, 3), mode="reflect").reshape(3, 20, -1)
    assert torch.equal(timing.median_filter(x, 7), padded.unfold(-1, 7, 1).median(dim=-1).values)


def test_words_follow_the_transcript_and_the_speech(padded):
    with Omni(family="whisper", options={"dtype": "float32"}) as omni:
        for audio, speech_end in padded:
            result = omni.transcribe(audio, 16000, word_timestamps=True)
            words = [w for s in result.segments for w in s.get("words", [])]
            assert _words(" ".join(w["word"] for w in words)) == _words(result.text)
            starts = [w["start"] for w in words]
            assert starts == sorted(starts) and all(w["start"] <= w["end"] <= result.duration for w in words)
            assert words[0]["start"] > LEAD - 0.5  # the silence before the sentence is not the first word's
            assert abs(words[-1]["end"] - speech_end) < 0.4
        plain = omni.transcribe(padded[0][0], 16000)
        taken = omni.stats()["stages"]["decoder"]["alignments_taken"]
    assert all("words" not in s for s in plain.segments)  # only on request
    assert taken == len(padded)  # each window aligned from its batch row, not computed again


def test_a_sentence_end_is_not_stretched_over_the_pause_after_it():
    """A sentence, silence, then speech cut by the window's end: the alignment path lingers on the
    sentence's last word until that speech, so its end is capped as the starts are (it ended
    18 s late before)."""
    sentence = to_16k(speak("The birch canoe slid on the smooth planks."))
    later = to_16k(speak("Glue the sheet to the dark blue background, it is easy to tell the depth of a well."))
    audio = np.zeros(16000 * 34, np.float32)
    audio[16000 : 16000 + len(sentence)] = sentence
    later = later[: 16000 * 34 - int(16000 * 27.5)]
    audio[int(16000 * 27.5) : int(16000 * 27.5) + len(later)] = later
    with Omni(family="whisper", options={"dtype": "float32"}) as omni:
        result = omni.transcribe(audio, 16000, word_timestamps=True)
    words = [w for s in result.segments for w in s.get("words", [])]
    planks = next(w for w in words if w["word"].startswith("planks"))
    assert abs(planks["end"] - (1 + len(sentence) / 16000)) < 0.5


def test_a_word_timing_failure_fails_only_its_request(tmp_path):
    path = Path(write_tiny(str(tmp_path / "tiny")))
    generation = json.loads((path / "generation_config.json").read_text())
    generation["alignment_heads"] = [[99, 0]]  # a layer the decoder does not have
    (path / "generation_config.json").write_text(json.dumps(generation))
    noise = (0.1 * np.random.default_rng(2).standard_normal(16000 * 2)).astype(np.float32)
    with Omni(family="whisper", model=str(path), options={"dtype": "float32"}) as omni:
        with pytest.raises(RequestFailed, match="word timestamps: IndexError"):
            omni.transcribe(noise, 16000, word_timestamps=True)
        assert omni.transcribe(noise, 16000).usage["output_tokens"] >= 1  # the decoder serves on
        assert omni.stats()["stages"]["decoder"]["running"] == 0
