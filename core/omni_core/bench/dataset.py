"""Benchmark prompts: a built-in set that needs no files, or a JSONL dataset.

A JSONL line is an object with any of:
``text`` (speech input, chat message, or the reference transcript of ``audio``),
``audio`` (a file path: the audio to transcribe, or the spoken chat message),
``reference_audio`` + ``reference_text`` (zero-shot cloning for speech).
Relative paths resolve against the dataset file's folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import soundfile

ENDPOINTS = ("speech", "transcriptions", "chat")

# Short to long, so a run mixes quick and slow requests as real traffic does.
BUILTIN_TEXTS = (
    "Hello there.",
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "It is a bright cold day in April, and the clocks are striking thirteen.",
    "Streaming speech should start playing quickly and never stall while the listener waits.",
    "A benchmark that runs without any files lets anyone compare two servers in a minute.",
    "Six spoons of fresh snow peas, five thick slabs of blue cheese, and maybe a snack for her brother.",
    "When the sunlight strikes raindrops in the air, they act as a prism and form a rainbow, "
    "which is a division of white light into many beautiful colors.",
)


class DatasetError(ValueError):
    """A dataset that cannot drive the chosen endpoint; the message names the file and line."""


@dataclass(frozen=True)
class BenchItem:
    text: str | None = None
    audio: Path | None = None
    reference_audio: Path | None = None
    reference_text: str | None = None

    def audio_seconds(self) -> float:
        return soundfile.info(str(self.audio)).duration if self.audio else 0.0


def load_jsonl(path: str | os.PathLike, endpoint: str) -> list[BenchItem]:
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"dataset {path} does not exist")
    items = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise DatasetError(f"{where}: expected an object, got {type(row).__name__}")
        items.append(_item_from_row(row, path.parent, where, endpoint))
    if not items:
        raise DatasetError(f"dataset {path} has no rows")
    return items


def _item_from_row(row: dict, base: Path, where: str, endpoint: str) -> BenchItem:
    unknown = set(row) - {"text", "audio", "reference_audio", "reference_text"}
    if unknown:
        raise DatasetError(f"{where}: unknown fields {sorted(unknown)}")

    def path_field(name: str) -> Path | None:
        value = row.get(name)
        if value is None:
            return None
        resolved = (base / value) if not os.path.isabs(value) else Path(value)
        if not resolved.is_file():
            raise DatasetError(f"{where}: {name} file {resolved} does not exist")
        return resolved

    item = BenchItem(
        text=row.get("text"),
        audio=path_field("audio"),
        reference_audio=path_field("reference_audio"),
        reference_text=row.get("reference_text"),
    )
    if endpoint == "speech" and not item.text:
        raise DatasetError(f"{where}: the speech endpoint needs 'text'")
    if endpoint == "transcriptions" and item.audio is None:
        raise DatasetError(f"{where}: the transcriptions endpoint needs 'audio'")
    if endpoint == "chat" and not (item.text or item.audio):
        raise DatasetError(f"{where}: the chat endpoint needs 'text' or 'audio'")
    if (item.reference_audio is None) != (item.reference_text is None):
        raise DatasetError(f"{where}: cloning needs both reference_audio and reference_text")
    return item


def builtin_items(endpoint: str, cache_dir: str | os.PathLike | None = None) -> list[BenchItem]:
    """The built-in prompts; for transcriptions each text is spoken by espeak-ng (cached)."""
    if endpoint != "transcriptions":
        return [BenchItem(text=text) for text in BUILTIN_TEXTS]
    return [BenchItem(text=text, audio=spoken(text, cache_dir)) for text in BUILTIN_TEXTS]


def spoken(text: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """A wav of ``text`` spoken by espeak-ng, made once and kept in ``cache_dir``."""
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        raise DatasetError(
            "the built-in transcription prompts are spoken by espeak-ng, which is not installed; "
            "install it (apt-get install espeak-ng) or pass --dataset with audio files"
        )
    folder = Path(cache_dir or Path(tempfile.gettempdir()) / "omni-bench-audio")
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.wav"
    if not target.exists():
        # Write aside then rename, so a run killed midway never leaves a truncated file behind.
        partial = target.with_suffix(f".{os.getpid()}.partial")
        subprocess.run([espeak, "-w", str(partial), text], check=True, capture_output=True)
        os.replace(partial, target)
    return target


def load_items(endpoint: str, dataset: str | None, cache_dir: str | None = None) -> list[BenchItem]:
    if endpoint not in ENDPOINTS:
        raise DatasetError(f"unknown endpoint {endpoint!r}; choose one of {', '.join(ENDPOINTS)}")
    return load_jsonl(dataset, endpoint) if dataset else builtin_items(endpoint, cache_dir)
