"""Saved voices: a reference clip and its transcript per voice, in one directory.

Each voice is ``<id>.wav`` (the reference, 16-bit mono at its original rate) plus ``<id>.json``
(name, transcript, sample rate, creation time). Both are written to a temporary file in the same
directory and moved into place with ``os.replace``; the JSON goes last and is what makes a voice
exist, so a crash mid-write leaves no half voice behind and a restart sees every finished one.
"""

from __future__ import annotations

import io
import json
import os
import re
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

_NAME = re.compile(r"^[\w][\w .-]{0,63}$")
_ID = re.compile(r"^voice_[0-9a-f]{16}$")


class VoiceStoreError(ValueError):
    pass


@dataclass
class SavedVoice:
    id: str
    name: str
    text: str
    sample_rate: int
    duration: float
    created_at: int

    def to_json(self) -> dict:
        return {"object": "audio.voice", "type": "saved", **asdict(self)}


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class VoiceStore:
    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def list(self) -> list[SavedVoice]:
        voices = []
        for meta in sorted(self.dir.glob("voice_*.json")):
            voice = self._read_meta(meta)
            if voice is not None and meta.with_suffix(".wav").exists():
                voices.append(voice)
        return sorted(voices, key=lambda v: (v.created_at, v.id))

    def _read_meta(self, path: Path) -> SavedVoice | None:
        try:
            return SavedVoice(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None  # unreadable entries are skipped, never fatal

    def find(self, id_or_name: str) -> SavedVoice | None:
        for voice in self.list():
            if id_or_name in (voice.id, voice.name):
                return voice
        return None

    def load_audio(self, voice: SavedVoice) -> tuple[np.ndarray, int]:
        audio, rate = sf.read(self.dir / f"{voice.id}.wav", dtype="float32")
        return audio, rate

    def save(
        self, name: str, audio: np.ndarray, rate: int, text: str, reserved: set[str] = frozenset()
    ) -> SavedVoice:
        if not _NAME.match(name or ""):
            raise VoiceStoreError(
                "name must be 1-64 letters, digits, spaces, '.', '_' or '-', starting with a letter or digit"
            )
        with self._lock:
            if name in reserved or self.find(name) is not None:
                raise VoiceStoreError(f"a voice named {name!r} already exists")
            voice = SavedVoice(
                id=f"voice_{uuid.uuid4().hex[:16]}",
                name=name,
                text=text,
                sample_rate=int(rate),
                duration=round(len(audio) / rate, 3),
                created_at=int(time.time()),
            )
            wav = self.dir / f"{voice.id}.wav"
            buffer = io.BytesIO()
            sf.write(buffer, np.asarray(audio, dtype=np.float32), rate, format="WAV", subtype="PCM_16")
            _atomic_write(wav, buffer.getvalue())
            _atomic_write(self.dir / f"{voice.id}.json", json.dumps(asdict(voice)).encode())
            return voice

    def delete(self, voice_id: str) -> bool:
        with self._lock:
            if not _ID.match(voice_id):  # what save makes: anything else names no voice (nor a path)
                return False
            meta = self.dir / f"{voice_id}.json"
            if not meta.exists():
                return False
            meta.unlink()  # the voice is gone from here on; the audio is only its payload
            (self.dir / f"{voice_id}.wav").unlink(missing_ok=True)
            return True
