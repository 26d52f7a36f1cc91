"""The playground in a real browser (Chromium, headless) against a real `omni serve --family
cosyvoice3 --preset tiny --api-key ...`: the key entered once and kept, only the speech and voices
tabs, speech that plays through Web Audio as it streams, the API's own error message, a saved voice
in the picker, cloning from a recording of the (fake) microphone. The tiny preset's audio is noise:
these tests check what the page does with it, not how it sounds."""

from __future__ import annotations

import base64
import io
import json

import httpx
import pytest
import soundfile as sf

from tests.helpers.browser import API_KEY, skip_without_browser
from tests.helpers.server import OmniServer

AUTH = {"Authorization": f"Bearer {API_KEY}"}

skip_without_browser()  # before any server starts


@pytest.fixture(scope="module")
def server(tiny_dir, omni_cache, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("cosyvoice3-playground")
    # the preset is already written under OMNI_CACHE: `--preset tiny` finds and reuses it
    proc = OmniServer(
        "cosyvoice3",
        workdir,
        "--preset",
        "tiny",
        "--api-key",
        API_KEY,
        "--voices-dir",
        str(workdir / "voices"),
        "--option",
        "min_length_blocks=all",  # replies long enough to stream in several chunks
        OMNI_PLUGINS="cosyvoice3",
        OMNI_CACHE=str(omni_cache),
        OMP_NUM_THREADS="1",
    )
    proc.wait_ready()
    yield proc.url
    proc.stop()


def speech_requests(page) -> list[dict]:
    """The bodies of the speech requests the page sends from now on."""
    sent: list[dict] = []
    page.page.on(
        "request", lambda r: r.url.endswith("/v1/audio/speech") and sent.append(json.loads(r.post_data))
    )
    return sent


def received(page) -> None:
    """Waits until the whole reply has arrived (and is playing): the streaming test checks that
    it plays to its end, the others need not wait for that in real time."""
    page.page.wait_for_selector(
        "#speech-result[data-state=done], #speech-result[data-state=played]", state="attached", timeout=60_000
    )
    assert int(page.data("#speech-result")["samples"]) > 0


def test_key_entered_once_is_kept_for_the_session(server, keyless_page):
    refusal = httpx.get(f"{server}/v1/models").json()["error"]["message"]
    page = keyless_page.page
    page.goto(f"{server}/")  # the index, open without the key, links to the playground
    page.click("#playground-link")
    page.wait_for_selector("#server-status.error")
    assert page.inner_text("#server-status") == refusal
    assert keyless_page.tabs() == []

    page.fill("#api-key", API_KEY)
    page.click("#key-form button[type=submit]")
    page.wait_for_selector("body[data-ready=true]", state="attached")
    assert keyless_page.tabs() == [
        "Speech",
        "Voices",
    ]  # the tasks cosyvoice3 serves: no transcription, no chat

    keyless_page.errors.clear()  # the first load's 401, before the key, is the browser's own log line
    page.reload()
    page.wait_for_selector("body[data-ready=true]", state="attached")
    assert "serves speech" in page.inner_text("#server-status")
    assert page.input_value("#api-key") == API_KEY
    assert page.locator("#speech-voice option").all_inner_texts()[0] == "default"
    assert keyless_page.errors == []


def test_speech_plays_through_web_audio_as_it_streams(server, page):
    page.open(server)
    # long enough for several chunks, spaced out in time: the page reads them one by one
    page.page.fill("#speech-input", "Hello there, this sentence is long enough to stream in several chunks.")
    page.page.fill("#speech-seed", "1")
    page.page.select_option("#speech-format", "wav")
    page.page.click("#speech-play")
    page.page.wait_for_selector("#speech-result[data-state=played]", state="attached", timeout=60_000)
    result = page.data("#speech-result")
    rate = int(result["sampleRate"])
    seconds = int(result["samples"]) / rate
    assert rate == 24000  # the server's X-Sample-Rate
    assert int(result["chunks"]) >= 2 and int(result["firstAudioMs"]) < int(result["streamMs"])
    # the audio clock ran through every sample scheduled
    assert float(result["playedSeconds"]) >= seconds - 0.01 > 0
    replay = page.page.wait_for_function("document.querySelector('#speech-audio').duration")
    assert replay.json_value() == pytest.approx(seconds, abs=0.01)
    assert page.page.get_attribute("#speech-download", "download") == "speech.wav"
    assert page.page.is_visible("#speech-waveform")
    assert page.errors == []


def test_whole_file_formats_play_once_decoded(server, page):
    page.open(server)
    page.page.fill("#speech-input", "Hello there!")  # short: it plays in real time
    page.page.select_option("#speech-format", "flac")
    page.page.click("#speech-play")
    page.page.wait_for_selector("#speech-result[data-state=played]", state="attached", timeout=60_000)
    result = page.data("#speech-result")
    assert int(result["chunks"]) == 1 and int(result["samples"]) > 0
    assert page.page.get_attribute("#speech-download", "download") == "speech.flac"
    assert page.errors == []


def test_empty_text_shows_the_apis_own_message(server, page):
    body = {
        "model": "cosyvoice3",
        "input": "",
        "voice": "default",
        "response_format": "pcm",
        "stream_format": "audio",
    }
    refusal = httpx.post(f"{server}/v1/audio/speech", json=body, headers=AUTH)
    assert refusal.status_code == 400
    page.open(server)
    page.page.fill("#speech-input", "")
    page.page.click("#speech-play")
    page.page.wait_for_selector("#speech-error", state="visible")
    assert page.page.inner_text("#speech-error") == refusal.json()["error"]["message"]
    assert page.data("#speech-result")["state"] == "failed"


def test_saved_voice_appears_in_the_picker_speaks_and_is_deleted(server, page, reference):
    _, _, transcript, path = reference
    page.open(server, "voices")
    page.page.fill("#voice-name", "narrator")
    page.page.set_input_files("#voice-audio .audio-file", str(path))
    page.page.fill("#voice-text", transcript)
    page.page.click("#voice-save")
    page.page.wait_for_selector("#voices-list li:has-text('narrator') button.delete")
    saved = next(
        v
        for v in httpx.get(f"{server}/v1/audio/voices", headers=AUTH).json()["data"]
        if v["name"] == "narrator"
    )
    assert page.page.locator("#speech-voice optgroup[label=Saved] option").all_inner_texts() == ["narrator"]

    page.page.click("#tab-speech")
    page.page.select_option("#speech-voice", saved["id"])
    sent = speech_requests(page)
    page.page.click("#speech-play")
    received(page)
    assert sent[-1]["voice"] == saved["id"]

    page.page.click("#tab-voices")
    page.page.click("#voices-list li:has-text('narrator') button.delete")
    page.page.wait_for_selector("#voices-list li:has-text('narrator')", state="detached")
    assert page.page.locator("#speech-voice optgroup[label=Saved]").count() == 0
    assert saved["id"] not in {
        v["id"] for v in httpx.get(f"{server}/v1/audio/voices", headers=AUTH).json()["data"]
    }
    assert page.errors == []


def test_clone_from_a_microphone_recording(server, page):
    page.open(server)
    page.page.select_option("#speech-voice", label="Clone from a reference…")
    record = "#speech-reference .audio-record"
    page.page.click(record)
    page.page.wait_for_selector(f"{record}:has-text('Stop recording')")
    page.page.wait_for_timeout(1200)  # the fake microphone's tone: the reference must last 0.2 s or more
    page.page.click(record)
    note = page.page.inner_text("#speech-reference .audio-note")
    assert note.startswith("recorded ") and float(note.split()[1]) >= 1.0, note
    page.page.fill("#speech-reference-text", "A tone from the fake microphone.")
    sent = speech_requests(page)
    page.page.click("#speech-play")
    received(page)
    assert "voice" not in sent[-1] and sent[-1]["reference_text"] == "A tone from the fake microphone."
    recording, rate = sf.read(io.BytesIO(base64.b64decode(sent[-1]["reference_audio"])))
    assert len(recording) / rate >= 1.0 and abs(recording).max() > 0.01  # the tone, as a wav
    assert page.errors == []
