"""Long text in segments: whole sentences packed up to a token budget, each spoken as its own
request, as the reference implementation speaks long text (one utterance's speech-token limit,
the flow's fixed noise and every cache grow with its length).

Cuts go after sentence ends (``. ! ? ; …`` and their CJK forms) where they can; a sentence over
the budget is cut after its commas and colons, then between words, then (a run of text without
spaces, such as CJK without punctuation) every few characters. Nothing is dropped or added:
the segments joined give the text back, less the whitespace at the cuts. A short tail joins
the segment before it. Text with ``<|...|>`` markup is left whole.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

SEGMENT_TOKENS = 80  # text tokens a segment holds at most (speech is up to 20 tokens a text token)
# ASCII marks end a sentence or clause only before whitespace (not in "3.14" or "1,000")
_SENTENCE_END = re.compile(r"[.!?;…]+[\"'”’)\]]*(?:\s+|$)|[。！？；]+[」』”’)]*\s*|\n\s*")
_CLAUSE_END = re.compile(r"[,:]+(?:\s+|$)|[，、：]+\s*")
_WORD = re.compile(r"\s*\S+\s*")


def _cut_after(pattern: re.Pattern, text: str) -> list[str]:
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
    """(run, tokens) of ``text`` in runs of characters of at most ``budget`` tokens."""
    out, start = [], 0
    while start < len(text):
        end = min(len(text), start + 8 * budget)  # a first guess (8 characters a token), then shrunk
        while (tokens := count(text[start:end])) > budget and end - start > 1:
            end = start + max(1, (end - start) * budget // tokens)
        out.append((text[start:end], tokens))
        start = end
    return out


def _pieces(text: str, count: Callable[[str], int], budget: int) -> list[tuple[str, int]]:
    """(piece, tokens) of ``text``: its sentences, those over ``budget`` cut after their clauses,
    then between words, then into runs of characters."""
    out: list[tuple[str, int]] = []

    def add(piece: str, finer: tuple[re.Pattern, ...]) -> None:
        tokens = count(piece)
        if tokens <= budget:
            out.append((piece, tokens))
        elif finer:
            for part in _cut_after(finer[0], piece):
                add(part, finer[1:])
        else:
            out.extend(_characters(piece, count, budget))

    for sentence in _cut_after(_SENTENCE_END, text):
        add(sentence, (_CLAUSE_END, _WORD))
    return out


def split_text(text: str, count: Callable[[str], int], budget: int = SEGMENT_TOKENS) -> list[str]:
    """``text`` as segments of at most about ``budget`` tokens (``count`` gives a string's)."""
    if "<|" in text and "|>" in text:
        return [text]
    segments: list[tuple[str, int]] = []
    for piece, tokens in _pieces(text, count, budget):
        if segments and segments[-1][1] + tokens <= budget:
            segments[-1] = (segments[-1][0] + piece, segments[-1][1] + tokens)
        else:
            segments.append((piece, tokens))
    if len(segments) > 1 and segments[-1][1] < budget // 4:  # a short tail joins the segment before
        tail = segments.pop()
        segments[-1] = (segments[-1][0] + tail[0], segments[-1][1] + tail[1])
    return [stripped for segment, _ in segments if (stripped := segment.strip())]


@functools.cache
def _tokenizer(checkpoint_dir: str):
    from .text_tokenizer import TextTokenizer

    return TextTokenizer(Path(checkpoint_dir) / "CosyVoice-BlankEN")


def split_speech(checkpoint_dir: str, payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The payloads of a speech request's segments (``FamilySpec.split_speech``); a seeded
    request's segment ``i`` takes seed + i."""
    text = payload.get("text")
    if not isinstance(text, str) or not text.strip():
        return [payload]  # the frontend answers for it
    tokenizer = _tokenizer(checkpoint_dir)
    parts = split_text(text, lambda s: len(tokenizer.encode(s)))
    if len(parts) <= 1:
        return [payload]
    seed = payload.get("seed")
    return [{**payload, "text": part, "seed": None if seed is None else seed + i} for i, part in enumerate(parts)]
