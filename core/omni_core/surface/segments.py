"""Long text in segments, for families that speak it one request a segment
(``FamilySpec.split_speech``): each family measures text its own way (tokens, bytes) and keeps
its own rules for markup; the cutting and packing are the same.

Cuts go after sentence ends (``. ! ? ; …`` and their CJK forms, ASCII marks only before
whitespace, so "3.14" and "1,000" stay whole) where they can; a sentence over the budget is cut
after its commas and colons, then between words, then (a run without spaces, such as CJK
without punctuation) every few characters. Pieces are packed up to the budget. Nothing is
dropped or added: the segments joined give the text back, less the whitespace at the cuts.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

SENTENCE_END = re.compile(r"[.!?;…]+[\"'”’)\]]*(?:\s+|$)|[。！？；]+[」』”’)]*\s*|\n\s*")
CLAUSE_END = re.compile(r"[,:]+(?:\s+|$)|[，、：]+\s*")
WORD = re.compile(r"\s*\S+\s*")


def cut_after(pattern: re.Pattern, text: str) -> list[str]:
    """``text`` cut after each match of ``pattern`` (pieces keep their separators)."""
    pieces, start = [], 0
    for match in pattern.finditer(text):
        if match.end() > start:
            pieces.append(text[start : match.end()])
            start = match.end()
    if start < len(text):
        pieces.append(text[start:])
    return pieces


def _characters(text: str, count: Callable[[str], int], budget: int) -> list[tuple[str, int]]:
    """(run, size) of ``text`` in runs of characters of at most ``budget``."""
    out, start = [], 0
    while start < len(text):
        end = min(len(text), start + 8 * budget)  # a first guess (8 characters a unit), then shrunk
        while (size := count(text[start:end])) > budget and end - start > 1:
            end = start + max(1, (end - start) * budget // size)
        out.append((text[start:end], size))
        start = end
    return out


def pieces(text: str, count: Callable[[str], int], budget: int) -> list[tuple[str, int]]:
    """(piece, size) of ``text``: its sentences, those over ``budget`` cut after their clauses,
    then between words, then into runs of characters (``count`` gives a string's size)."""
    out: list[tuple[str, int]] = []

    def add(piece: str, finer: tuple[re.Pattern, ...]) -> None:
        size = count(piece)
        if size <= budget:
            out.append((piece, size))
        elif finer:
            for part in cut_after(finer[0], piece):
                add(part, finer[1:])
        else:
            out.extend(_characters(piece, count, budget))

    for sentence in cut_after(SENTENCE_END, text):
        add(sentence, (CLAUSE_END, WORD))
    return out


def pack(sized: list[tuple[str, int]], budget: int, join_short_tail: bool = True) -> list[str]:
    """Consecutive pieces joined while they fit ``budget``; with ``join_short_tail``, a last
    segment under a quarter of the budget joins the one before (it may then pass the budget)."""
    segments: list[tuple[str, int]] = []
    for piece, size in sized:
        if segments and segments[-1][1] + size <= budget:
            segments[-1] = (segments[-1][0] + piece, segments[-1][1] + size)
        else:
            segments.append((piece, size))
    if join_short_tail and len(segments) > 1 and segments[-1][1] < budget // 4:
        tail = segments.pop()
        segments[-1] = (segments[-1][0] + tail[0], segments[-1][1] + tail[1])
    return [stripped for segment, _ in segments if (stripped := segment.strip())]


def split_text(text: str, count: Callable[[str], int], budget: int, join_short_tail: bool = True) -> list[str]:
    """``text`` as segments of at most about ``budget`` (``count`` gives a string's size)."""
    return pack(pieces(text, count, budget), budget, join_short_tail)


def segment_payloads(payload: dict[str, Any], parts: list[str]) -> list[dict[str, Any]]:
    """A speech request's payload for each of its text ``parts`` (the payload itself for one part);
    a seeded request's segment ``i`` takes seed + i, so segments do not repeat each other."""
    if len(parts) <= 1:
        return [payload]
    seed = payload.get("seed")
    return [{**payload, "text": part, "seed": None if seed is None else seed + i} for i, part in enumerate(parts)]
