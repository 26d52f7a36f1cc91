"""Long text in segments: whole sentences packed up to a token budget, each spoken as its own
request, as the reference implementation speaks long text (one utterance's speech-token limit,
the flow's fixed noise and every cache grow with its length). The cutting and packing are the
core's (``omni_core.surface.segments``); a short tail joins the segment before it, and text with
``<|...|>`` markup is left whole.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omni_core.surface import segments

SEGMENT_TOKENS = 80  # text tokens a segment holds at most (speech is up to 20 tokens a text token)


def split_text(text: str, count: Callable[[str], int], budget: int = SEGMENT_TOKENS) -> list[str]:
    """``text`` as segments of at most about ``budget`` tokens (``count`` gives a string's)."""
    if "<|" in text and "|>" in text:
        return [text]
    return segments.split_text(text, count, budget)


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
    return segments.segment_payloads(payload, split_text(text, lambda s: len(tokenizer.encode(s))))
