"""Server-sent events, subtitle formats (SRT, WebVTT) and language names."""

from __future__ import annotations

import functools
import json
from typing import Any


def sse(data: dict[str, Any] | str) -> bytes:
    body = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {body}\n\n".encode()


def _timestamp(seconds: float, decimal: str) -> str:
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{millis:03d}"


def to_srt(segments: list[dict[str, Any]]) -> str:
    blocks = []
    for index, seg in enumerate(segments, start=1):
        start, end = _timestamp(seg["start"], ","), _timestamp(seg["end"], ",")
        blocks.append(f"{index}\n{start} --> {end}\n{seg['text'].strip()}\n")
    return "\n".join(blocks)


def to_vtt(segments: list[dict[str, Any]]) -> str:
    blocks = ["WEBVTT\n"]
    for seg in segments:
        start, end = _timestamp(seg["start"], "."), _timestamp(seg["end"], ".")
        blocks.append(f"{start} --> {end}\n{seg['text'].strip()}\n")
    return "\n".join(blocks)


@functools.cache
def _language_names() -> dict[str, str]:
    # Whisper's table (code -> lowercase English name) is where OpenAI's names come from
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    return dict(LANGUAGES)


def language_name(code: str | None) -> str | None:
    """The name OpenAI's verbose_json gives a language (``"english"``) for the ISO 639 code a
    family reports (``"en"``); anything else as it is."""
    if not isinstance(code, str):
        return code
    return _language_names().get(code.lower(), code)
