"""Long text in segments, each spoken as its own request and joined in order
(``FamilySpec.split_speech``), as the reference speaks long text in pieces of about
``chunk_length`` UTF-8 bytes (its server's default: 200).

Text with speaker tags (``<|speaker:N|>``) is cut between turns only, as the reference groups
whole turns. Other text is cut after sentence ends where it can; a sentence over the budget is cut
after its commas and colons, then between words, then every few characters. Pieces are packed
up to the budget; nothing is dropped or added but the whitespace at the cuts.
"""

from __future__ import annotations

import re
from typing import Any

SEGMENT_BYTES = 200
_SPEAKER = re.compile(r"(?=<\|speaker:\d+\|>)")
_SENTENCE_END = re.compile(r"[.!?;…]+[\"'”’)\]]*(?:\s+|$)|[。！？；]+[」』”’)]*\s*|\n\s*")
_CLAUSE_END = re.compile(r"[,:]+(?:\s+|$)|[，、：]+\s*")
_WORD = re.compile(r"\s*\S+\s*")


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def _cut_after(pattern: re.Pattern, text: str) -> list[str]:
    pieces, start = [], 0
    for match in pattern.finditer(text):
        if match.end() > start:
            pieces.append(text[start : match.end()])
            start = match.end()
    return pieces + ([text[start:]] if start < len(text) else [])


def _pieces(text: str, budget: int, finer: tuple[re.Pattern, ...]) -> list[str]:
    if _size(text) <= budget:
        return [text]
    if not finer:  # a run without spaces: every few characters
        step = max(1, budget // 4)
        return [text[i : i + step] for i in range(0, len(text), step)]
    return [p for part in _cut_after(finer[0], text) for p in _pieces(part, budget, finer[1:])]


def split_text(text: str, budget: int = SEGMENT_BYTES) -> list[str]:
    if _SPEAKER.search(text):
        pieces = [turn for turn in _SPEAKER.split(text) if turn.strip()]
    else:
        pieces = _pieces(text, budget, (_SENTENCE_END, _CLAUSE_END, _WORD))
    segments: list[str] = []
    for piece in pieces:
        if segments and _size(segments[-1] + piece) <= budget:
            segments[-1] += piece
        else:
            segments.append(piece)
    return [stripped for segment in segments if (stripped := segment.strip())]


def split_speech(checkpoint_dir: str, payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The payloads of a speech request's segments; a seeded request's segment ``i`` takes seed + i."""
    text = payload.get("text")
    if not isinstance(text, str) or not text.strip():
        return [payload]  # the frontend answers for it
    parts = split_text(text)
    if len(parts) <= 1:
        return [payload]
    seed = payload.get("seed")
    return [
        {**payload, "text": part, "seed": None if seed is None else seed + i} for i, part in enumerate(parts)
    ]
