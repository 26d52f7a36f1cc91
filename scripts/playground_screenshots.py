"""Regenerates the playground's screenshots in docs/images/ (one per tab, 1280x800):

    python3 scripts/playground_screenshots.py

It serves cosyvoice3 and qwen3-omni on their tiny presets (random weights: their audio and words
are noise) and whisper on its bundled tiny.en, each with an API key, on 127.0.0.1, then drives the
playground in headless Chromium as a user would: a voice saved from a clip, speech played with
it, a clip transcribed with word timestamps, a chat turn answered with audio. It needs what
`bash scripts/setup.sh --test` installs (Playwright, Debian's chromium, espeak-ng).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the test helpers start servers and the browser as the tests do

from tests.helpers.browser import API_KEY, launch  # noqa: E402
from tests.helpers.server import OmniServer  # noqa: E402

IMAGES = ROOT / "docs" / "images"
VIEWPORT = {"width": 1280, "height": 800}
CLIP_TEXT = "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background."
WAIT_MS = 120_000


def spoken(text: str, path: Path) -> Path:
    if shutil.which("espeak-ng") is None:
        sys.exit("espeak-ng is not installed (bash scripts/setup.sh --test installs it)")
    subprocess.run(
        ["espeak-ng", "-v", "en-us", "-s", "160", "-w", str(path), text], check=True, capture_output=True
    )
    return path


def start_servers(workdir: Path) -> dict[str, OmniServer]:
    common = {"OMNI_CACHE": str(workdir / "cache"), "OMNI_API_KEY": API_KEY, "OMP_NUM_THREADS": "1"}
    started = {
        "cosyvoice3": OmniServer(
            "cosyvoice3",
            workdir,
            "--preset",
            "tiny",
            "--voices-dir",
            str(workdir / "voices"),
            "--option",
            "min_length_blocks=all",  # random weights stop at random: long enough to stream in chunks
            OMNI_PLUGINS="cosyvoice3",
            **common,
        ),
        "whisper": OmniServer("whisper", workdir, OMNI_PLUGINS="whisper", **common),
        "qwen3-omni": OmniServer(
            "qwen3-omni",
            workdir,
            "--preset",
            "tiny",
            "--option",
            "talker_max_tokens=60",
            "--option",
            "max_model_len=1024",
            OMNI_PLUGINS="qwen3-omni",
            **common,
        ),
    }
    return started


def open_tab(context, url: str, tab: str):
    page = context.new_page()
    page.goto(f"{url}/playground#{tab}")
    page.wait_for_selector("body[data-ready=true]", state="attached", timeout=WAIT_MS)
    return page


def shoot(page, name: str) -> None:
    page.evaluate("window.scrollTo(0, 0)")
    path = IMAGES / f"playground-{name}.png"
    page.screenshot(path=str(path))
    print(f"{path.relative_to(ROOT)}: {path.stat().st_size // 1024} KB")


def voices_and_speech(context, url: str, clip: Path) -> None:
    page = open_tab(context, url, "voices")
    page.fill("#voice-name", "narrator")
    page.set_input_files("#voice-audio .audio-file", str(clip))
    page.fill("#voice-text", CLIP_TEXT)
    page.click("#voice-save")
    page.wait_for_selector("#voices-list li:has-text('narrator')")
    shoot(page, "voices")

    page.click("#tab-speech")
    page.fill("#speech-input", "Hello! This is omni speaking, one chunk at a time.")
    page.select_option("#speech-voice", label="narrator")
    page.click("#speech-play")
    page.wait_for_selector("#speech-result[data-state=played]", state="attached", timeout=WAIT_MS)
    page.wait_for_function("document.querySelector('#speech-audio').duration > 0")
    shoot(page, "speech")


def transcription(context, url: str, clip: Path) -> None:
    page = open_tab(context, url, "transcription")
    page.set_input_files("#transcription-input .audio-file", str(clip))
    page.select_option("#transcription-format", "verbose_json")
    page.check("#transcription-words")
    page.click("#transcription-run")
    page.wait_for_selector("#transcription-result[data-state=done]", state="attached", timeout=WAIT_MS)
    page.wait_for_function("document.querySelector('#transcription-audio').duration > 0")
    shoot(page, "transcription")


def chat(context, url: str) -> None:
    page = open_tab(context, url, "chat")
    page.fill("#chat-input", "Good morning! What is new today?")
    page.check("#chat-speak")
    page.fill("#chat-max-tokens", "60")
    page.fill("#chat-seed", "7")
    page.click("#chat-send")
    page.wait_for_selector("#chat-log li.assistant[data-state=played]", state="attached", timeout=WAIT_MS)
    page.wait_for_function("[...document.querySelectorAll('#chat-log audio')].every(a => a.duration > 0)")
    shoot(page, "chat")


def main() -> None:
    from playwright.sync_api import sync_playwright

    IMAGES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="omni-playground-") as tmp:
        workdir = Path(tmp)
        clip = spoken(CLIP_TEXT, workdir / "clip.wav")
        started = start_servers(workdir)
        try:
            for server in started.values():
                server.wait_ready(timeout_s=300)
            with sync_playwright() as playwright:
                browser = launch(playwright)
                context = browser.new_context(viewport=VIEWPORT)
                context.add_init_script(f"sessionStorage.setItem('omni.apiKey', {API_KEY!r})")
                voices_and_speech(context, started["cosyvoice3"].url, clip)
                transcription(context, started["whisper"].url, clip)
                chat(context, started["qwen3-omni"].url)
                browser.close()
        finally:
            for server in started.values():
                server.stop()


if __name__ == "__main__":
    main()
