"""Saved voices: a reference clip and its transcript per voice, in one directory.

Each voice is ``<id>.wav`` (the reference, 16-bit mono at its original rate) plus ``<id>.json``,
its record (name, transcript, sample rate, creation time): the record is what makes a voice
exist. A save writes the audio, then the record, each to a temporary file in the directory
(``.<name>.<random>.tmp``) that is fsynced and renamed into place, the directory fsynced after
each rename; a delete removes the record first. A crash at any point (a kill mid-save) can thus
leave only files no record names (temporary files, audio without its record) and never half a
voice; opening the store (server start-up) removes them. Saves, deletes and that sweep hold an
exclusive lock on the directory (``.lock``), so a process that opens the store never sweeps away
a save in progress in another one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
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

log = logging.getLogger("omni.voices")
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


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _durable_write(path: Path, write) -> None:
    """``write(file)`` into a temporary file beside ``path``, then (fsynced) renamed to ``path``;
    the directory is fsynced too, so the name survives a power cut as well as a kill."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _leftovers(names: set[str]) -> list[str]:
    """What no whole voice owns: temporary files, and audio or a record without the other."""
    partner = {".wav": ".json", ".json": ".wav"}

    def unpaired(name: str) -> bool:
        stem, ext = os.path.splitext(name)
        return ext in partner and bool(_ID.match(stem)) and stem + partner[ext] not in names

    return sorted(name for name in names if (name.startswith(".voice_") and name.endswith(".tmp")) or unpaired(name))


class VoiceStore:
    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        stray = self._sweep()
        if stray:
            log.warning("%s: removed %d file(s) an interrupted save or delete left: %s", self.dir, len(stray), ", ".join(stray))

    @contextlib.contextmanager
    def _exclusive(self):
        """This process's threads, then other processes sharing the directory, one at a time."""
        with self._lock, open(self.dir / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or its process dies
            yield

    def _sweep(self) -> list[str]:
        """Removes what a crash left: temporary files, and audio or a record without the other
        (a save writes the audio first, a delete removes the record first). Returns their names."""
        with self._exclusive():
            stray = _leftovers(set(os.listdir(self.dir)))
            for name in stray:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.dir / name)
            if stray:
                _fsync_dir(self.dir)
        return stray

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
        with self._exclusive():
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
            samples = np.asarray(audio, dtype=np.float32)
            _durable_write(
                self.dir / f"{voice.id}.wav",
                lambda f: sf.write(f, samples, rate, format="WAV", subtype="PCM_16"),
            )
            record = json.dumps(asdict(voice)).encode()
            _durable_write(self.dir / f"{voice.id}.json", lambda f: f.write(record))  # now it exists
            return voice

    def delete(self, voice_id: str) -> bool:
        if not _ID.match(voice_id):  # what save makes: anything else names no voice (nor a path)
            return False
        with self._exclusive():
            meta = self.dir / f"{voice_id}.json"
            if not meta.exists():
                return False
            meta.unlink()  # the voice is gone from here on; the audio is only its payload
            _fsync_dir(self.dir)
            (self.dir / f"{voice_id}.wav").unlink(missing_ok=True)
            return True
