"""Server-sent events and subtitle formats (SRT, WebVTT)."""

from __future__ import annotations

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
