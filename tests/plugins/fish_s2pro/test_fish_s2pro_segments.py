"""Long text in segments (FamilySpec.split_speech): whole sentences up to the byte budget,
speaker turns kept whole, nothing dropped."""

from __future__ import annotations

import re

from omni_fish_s2pro.segments import SEGMENT_BYTES, split_speech, split_text


def _squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_sentences_are_packed_up_to_the_budget_and_nothing_is_lost():
    text = "Hello there. " * 40 + "A long sentence, with commas, and more words than one segment holds " * 6
    segments = split_text(text)
    assert len(segments) > 3 and all(len(s.encode()) <= SEGMENT_BYTES for s in segments)
    assert _squeezed("".join(segments)) == _squeezed(text)
    assert all(s.endswith(".") for s in segments[:2])  # cut after sentences where they fit


def test_speaker_turns_stay_whole_and_short_text_is_one_request():
    turns = "<|speaker:0|>" + "one two three " * 10 + "<|speaker:1|>" + "four five six " * 10
    assert split_text(turns) == [
        turns[: turns.index("<|speaker:1|>")].strip(),
        turns[turns.index("<|speaker:1|>") :].strip(),
    ]
    payload = {"text": "Short.", "seed": 3}
    assert split_speech("unused", payload) == [payload]


def test_each_segment_takes_the_next_seed():
    parts = split_speech(
        "unused", {"text": "A sentence that is long enough. " * 20, "seed": 5, "voice": "default"}
    )
    assert len(parts) > 1 and [p["seed"] for p in parts] == list(range(5, 5 + len(parts)))
    assert all(p["voice"] == "default" for p in parts)


def test_segments_name_their_request_so_each_can_carry_those_before():
    parts = split_speech("unused", {"text": "A sentence that is long enough. " * 20, "seed": None})
    groups = {p["segment"]["group"] for p in parts}
    assert len(groups) == 1 and [p["segment"]["index"] for p in parts] == list(range(len(parts)))
    assert all(p["segment"]["count"] == len(parts) for p in parts)
    assert "segment" not in split_speech("unused", {"text": "Short."})[0]  # one request: nothing to carry
