"""The playground in a real browser (Chromium, headless) against a real `omni serve --family
whisper --api-key ...` (the bundled tiny.en): only the transcription tab, an uploaded file's text,
its words as buttons that seek the clip, and a subtitle format shown as the server wrote it."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.helpers.browser import API_KEY, skip_without_browser
from tests.helpers.server import OmniServer

SENTENCE = 5  # "We are going to the park this afternoon."

skip_without_browser()  # before any server starts


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = OmniServer(
        "whisper", tmp_path_factory.mktemp("whisper-playground"), "--api-key", API_KEY, OMNI_PLUGINS="whisper"
    )
    proc.wait_ready()
    yield proc.url
    proc.stop()


@pytest.fixture(scope="module")
def speech_file(spoken, tmp_path_factory):
    path = tmp_path_factory.mktemp("whisper-playground-audio") / "park.wav"
    path.write_bytes(spoken[SENTENCE])
    return path


def words(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]", " ", text.lower()).split())


def test_file_transcription_shows_the_text_and_words_that_seek(server, page, speech_file):
    page.open(server)
    assert page.tabs() == ["Transcription"]  # tiny.en transcribes only
    page.page.set_input_files("#transcription-input .audio-file", str(speech_file))
    page.page.select_option("#transcription-format", "verbose_json")
    page.page.check("#transcription-words")
    page.page.click("#transcription-run")
    page.page.wait_for_selector("#transcription-result[data-state=done]", state="attached", timeout=60_000)
    assert words(page.page.inner_text("#transcription-text")) == "we are going to the park this afternoon"
    assert int(page.data("#transcription-result")["segments"]) >= 1

    park = page.page.locator("#transcription-segments button.word", has_text="park")
    start = float(park.get_attribute("data-start"))
    assert start > 0.5  # a word well into the clip: the seek is seen
    park.click()
    position = page.page.evaluate("document.querySelector('#transcription-audio').currentTime")
    assert start - 0.01 <= position < start + 0.5
    assert page.errors == []


def test_subtitles_are_shown_as_the_server_wrote_them(server, page, speech_file):
    with open(speech_file, "rb") as audio:
        srt = httpx.post(
            f"{server}/v1/audio/transcriptions",
            files={"file": ("park.wav", audio)},
            data={"model": "whisper", "response_format": "srt"},
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=60,
        ).text
    page.open(server)
    page.page.set_input_files("#transcription-input .audio-file", str(speech_file))
    page.page.select_option("#transcription-format", "srt")
    page.page.click("#transcription-run")
    page.page.wait_for_selector("#transcription-result[data-state=done]", state="attached", timeout=60_000)
    assert page.page.text_content("#transcription-raw") == srt
    assert page.errors == []
