"""The speech stream's cutting of text that arrives in pieces: whole sentences as soon as they
end (and not before: "3." may go on as "3.14"), long clauses and runs cut at their bounds,
nothing spoken twice or lost."""

from __future__ import annotations

import pytest
from omni_core.serve.realtime.sentences import SentenceCutter


def _cut(pieces: list[str], **limits) -> tuple[list[list[str]], list[str]]:
    cutter = SentenceCutter(**limits)
    return [cutter.feed(piece) for piece in pieces], cutter.finish()


def test_a_sentence_is_given_once_its_end_is_certain():
    fed, rest = _cut(["Hello", " there.", " It costs 3.", "14 dollars! Re", "ally? Yes; and", " then"])
    assert fed == [[], [], ["Hello there."], ["It costs 3.14 dollars!"], ["Really?", "Yes;"], []]
    # "Hello there." as soon as the space after it came: speech starts before the next sentence
    assert rest == ["and then"]


@pytest.mark.parametrize(
    ("text", "sentences"),
    [
        ("你好。世界！再", ["你好。", "世界！"]),
        ('He said "hi." Then', ['He said "hi."']),
        ("One\nTwo", ["One"]),
        ("1,000 apples", []),
        ("... ", []),  # nothing to speak
    ],
)
def test_marks(text, sentences):
    assert SentenceCutter().feed(text) == sentences


def test_long_text_is_cut_at_clauses_then_spaces_then_characters():
    fed, _ = _cut(["word, " * 30], clause_chars=40, max_chars=100)
    assert fed[0] and all(len(s) <= 100 and s.endswith(",") for s in fed[0])
    fed, _ = _cut(["word " * 30], clause_chars=40, max_chars=100)
    assert fed[0] and all(len(s) <= 100 and not s.endswith(" ") for s in fed[0])
    fed, rest = _cut(["字" * 250], clause_chars=40, max_chars=100)
    assert fed[0] == ["字" * 100, "字" * 100] and rest == ["字" * 50]


def test_nothing_is_lost_or_repeated():
    text = "First one. Second, with a clause; third? " * 5 + "A tail without an end"
    pieces = [text[i : i + 7] for i in range(0, len(text), 7)]
    fed, rest = _cut(pieces, clause_chars=30, max_chars=60)
    spoken = [s for piece in fed for s in piece] + rest
    assert " ".join(spoken).split() == text.split()
