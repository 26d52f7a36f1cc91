"""Long text in segments: where the cuts go (a pure function over a token counter), and a long
request on the real pipeline: its audio and usage equal those of its segments spoken alone."""

from __future__ import annotations

import re

import numpy as np
import pytest
from omni_core.api import Omni
from omni_core.pipeline import RequestFailed
from omni_cosyvoice3.segments import split_speech, split_text


def words(text: str) -> int:
    """A stand-in token counter: one token a word."""
    return len(text.split())


def same_text(segments: list[str], text: str) -> bool:
    """Nothing dropped or added: the segments give the text back, whitespace aside."""
    return re.sub(r"\s+", "", "".join(segments)) == re.sub(r"\s+", "", text)


def test_sentences_are_packed_up_to_the_budget():
    sentences = [f"Sentence {i} has exactly six words." for i in range(10)]
    segments = split_text(" ".join(sentences), words, budget=20)
    assert segments == [" ".join(sentences[i : i + 3]) for i in (0, 3, 6)] + [sentences[9]]
    assert split_text("Short. Text.", words) == ["Short. Text."]
    # a tail under a quarter of the budget joins the segment before it
    assert [words(s) for s in split_text(" ".join(["word"] * 31), words, budget=10)] == [10, 10, 11]
    assert [words(s) for s in split_text(" ".join(["word"] * 35), words, budget=10)] == [10, 10, 10, 5]


def test_long_sentences_are_cut_at_clauses_then_words_then_characters():
    clauses = ", ".join(f"clause {i} of four words" for i in range(8)) + "."
    segments = split_text(clauses, words, budget=10)
    assert segments == [f"clause {i} of four words, clause {i + 1} of four words," for i in (0, 2, 4)] + [
        "clause 6 of four words, clause 7 of four words."
    ]
    cjk = "今天天气很好我们去公园散步吧" * 12  # no punctuation, no spaces: runs of characters
    pieces = split_text(cjk, len, budget=40)
    assert [len(p) for p in pieces] == [40, 40, 40, 48] and "".join(pieces) == cjk  # the 8 left joined the last
    assert same_text(segments, clauses)


def test_numbers_and_markup_are_not_cut():
    # a sentence over the budget is cut between words, never inside "3.14" or "1,000"
    assert split_text("Pi is 3.14 and 1,000 is big. Done now.", words, budget=5) == ["Pi is 3.14 and 1,000", "is big. Done now."]
    marked = "<|en|>" + " ".join(["Hello there."] * 40)
    assert split_text(marked, words, budget=5) == [marked]
    assert split_text("一句话。两句话！三句话？", len, budget=4) == ["一句话。", "两句话！", "三句话？"]


def test_split_speech_gives_each_segment_its_own_seed(tiny_dir):
    text = " ".join(f"This is sentence number {i}, about the weather today." for i in range(12))
    parts = split_speech(tiny_dir, {"task": "speech", "text": text, "seed": 5, "voice": "default"})
    assert len(parts) > 2 and [p["seed"] for p in parts] == list(range(5, 5 + len(parts)))
    assert all(p["voice"] == "default" for p in parts) and same_text([p["text"] for p in parts], text)
    assert split_speech(tiny_dir, {"text": "Hello.", "seed": 1}) == [{"text": "Hello.", "seed": 1}]
    assert [p["seed"] for p in split_speech(tiny_dir, {"text": text, "seed": None})] == [None] * len(parts)


@pytest.fixture(scope="module")
def omni(tiny_dir):
    with Omni("cosyvoice3", checkpoint_dir=tiny_dir, device="cpu") as omni:
        yield omni


def test_long_text_is_spoken_in_segments_equal_to_each_alone(omni, tiny_dir):
    text = "Far too many words to fit in one utterance. " * 16
    # as one utterance it asks for more speech than the tiny preset's 4096 positions hold
    with pytest.raises(RequestFailed, match="exceeds the engine's max_model_len"):
        omni.pipeline.submit(omni.speech_inputs(text, "default", seed=9)).collect(timeout=60)
    parts = split_speech(tiny_dir, {"text": text, "seed": 9})
    assert len(parts) > 2
    whole = omni.speech(text, voice="default", seed=9)
    alone = [omni.speech(p["text"], voice="default", seed=p["seed"]) for p in parts]
    expected = np.concatenate([a.audio for a in alone])
    assert len(whole.audio) == len(expected) > 0
    np.testing.assert_allclose(whole.audio, expected, atol=1e-5)
    assert whole.usage == {key: sum(a.usage[key] for a in alone) for key in ("input_tokens", "output_tokens")}
