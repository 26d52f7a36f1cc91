"""A voice save killed at any moment leaves no half voice, and nothing of it outlives the next
start: SIGKILLs at random moments of back-to-back saves, in a process of the store alone (many
kill points, quickly) and in a real `omni serve` restarted on the same directory."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from omni_core.surface.voices_store import VoiceStore

from tests.core.serve.server import ServerProcess, tone_wav

SAVER = """
import sys
import numpy as np
from omni_core.surface.voices_store import VoiceStore

store = VoiceStore(sys.argv[1])
clip = np.random.default_rng(0).uniform(-0.5, 0.5, 48000 * 10).astype(np.float32)
print("saving", flush=True)
for i in range(10**6):
    store.save(f"{sys.argv[2]} {i}", clip, 48000, "a clip")
"""


def leftovers(directory: Path) -> list[str]:
    """Files of no whole voice: temporary files, audio without its record, a record without audio."""
    names = set(os.listdir(directory)) - {".lock"}

    def whole(name: str) -> bool:
        stem = name.rsplit(".", 1)[0]
        return not name.startswith(".") and {f"{stem}.wav", f"{stem}.json"} <= names

    return sorted(name for name in names if not whole(name))


def whole_voices(directory: Path) -> list[str]:
    """The names of the voices in ``directory``, each checked whole: its audio as long as its record says."""
    store = VoiceStore(directory)
    for voice in store.list():
        audio, rate = store.load_audio(voice)
        assert rate == voice.sample_rate and len(audio) == round(voice.duration * rate), voice
    return [voice.name for voice in store.list()]


def test_a_save_killed_at_any_moment_leaves_no_half_voice_once_reopened(tmp_path):
    rng = random.Random(7)
    kills_that_left_files, deadline, run = 0, time.monotonic() + 4.0, 0
    while run < 4 or (time.monotonic() < deadline and run < 12):
        saver = subprocess.Popen([sys.executable, "-c", SAVER, str(tmp_path), f"run {run}"], stdout=subprocess.PIPE)
        assert saver.stdout.readline() == b"saving\n"
        time.sleep(rng.uniform(0.0, 0.06))
        saver.kill()
        saver.wait(timeout=10)
        saver.stdout.close()
        kills_that_left_files += bool(leftovers(tmp_path))
        names = whole_voices(tmp_path)  # opening the store is what a restart does
        assert leftovers(tmp_path) == [], run
        assert all(name.startswith("run ") for name in names)
        store = VoiceStore(tmp_path)
        for voice in store.list():  # keeps the directory small; the next run starts from nothing
            store.delete(voice.id)
        run += 1
    assert kills_that_left_files  # kills did land mid-save: the check above saw a crash's remains


def _save_until_gone(url: str, worker: int, clip: bytes) -> None:
    with httpx.Client(timeout=30) as client:
        for i in range(10**6):
            try:
                client.post(
                    f"{url}/v1/audio/voices",
                    data={"name": f"worker {worker} clip {i}", "text": "a tone"},
                    files={"file": ("ref.wav", clip, "audio/wav")},
                )
            except httpx.HTTPError:
                return  # the server was killed


def test_a_server_killed_while_saving_starts_again_with_whole_voices_only(testfamily_site, tmp_path):
    voices = tmp_path / "voices"
    clip = tone_wav(9.0, rate=48000)  # as long as the test family clones from
    for attempt in range(2):
        server = ServerProcess(testfamily_site, tmp_path, "--voices-dir", str(voices)).wait_ready()
        if attempt == 0:  # one whole voice, which must come through every kill
            kept = httpx.post(
                f"{server.url}/v1/audio/voices",
                data={"name": "keeper", "text": "a tone"},
                files={"file": ("ref.wav", clip, "audio/wav")},
                timeout=30,
            )
            assert kept.status_code == 200, kept.text
        savers = [threading.Thread(target=_save_until_gone, args=(server.url, w, clip)) for w in range(3)]
        for saver in savers:
            saver.start()
        deadline = time.monotonic() + 10
        if attempt == 0:  # the moment a save's first temporary file appears
            while not any(name.endswith(".tmp") for name in os.listdir(voices)) and time.monotonic() < deadline:
                time.sleep(0.0005)
        else:  # at any moment
            time.sleep(random.uniform(0.2, 0.6))
        server.kill()
        server.stop()
        for saver in savers:
            saver.join(timeout=30)
    server = ServerProcess(testfamily_site, tmp_path, "--voices-dir", str(voices)).wait_ready()
    try:
        assert leftovers(voices) == []  # start-up removed what the kills left
        listed = httpx.get(f"{server.url}/v1/audio/voices", timeout=10).json()["data"]
        saved = sorted(v["name"] for v in listed if v["type"] == "saved")
        assert "keeper" in saved and saved == sorted(whole_voices(voices))
        spoken = httpx.post(
            f"{server.url}/v1/audio/speech",
            json={"model": "testfamily", "input": "hi", "voice": saved[0], "response_format": "pcm"},
            timeout=30,
        )
        assert spoken.status_code == 200 and len(spoken.content) == len(b"hi") * 400 * 2
    finally:
        assert server.stop() == 0, server.log()
