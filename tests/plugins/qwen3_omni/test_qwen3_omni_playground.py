"""The playground's chat in a real browser (Chromium, headless) against a real `omni serve --family
qwen3-omni --preset tiny` with an API key: the tabs of the tasks it serves, a reply whose audio
plays through Web Audio as it streams, and a conversation that carries its history. The tiny
preset's words and audio are noise: these tests check what the page does with them."""

from __future__ import annotations

import json

import pytest

from tests.helpers.browser import API_KEY, skip_without_browser

from .conftest import tiny_server

SPEECH = ("talker_temperature=0", "talker_max_tokens=40", "max_model_len=1024")

skip_without_browser()  # before any server starts


@pytest.fixture(scope="module")
def server(omni_cache, tiny_dir, tmp_path_factory):
    with tiny_server(
        omni_cache, tmp_path_factory.mktemp("qwen3-omni-playground"), *SPEECH, OMNI_API_KEY=API_KEY
    ) as proc:
        yield proc.url


def test_chat_reply_with_audio_plays_and_the_conversation_goes_on(server, page):
    page.open(server, "chat")
    assert page.tabs() == ["Speech", "Chat", "Voices"]
    assert page.page.is_visible("#chat-form") and not page.page.is_visible("#speech-form")
    sent = []
    page.page.on(
        "request", lambda r: r.url.endswith("/v1/chat/completions") and sent.append(json.loads(r.post_data))
    )

    page.page.fill("#chat-input", "Good morning!")
    page.page.check("#chat-speak")
    page.page.select_option("#chat-voice", "chelsie")
    page.page.fill("#chat-max-tokens", "8")
    page.page.fill("#chat-seed", "7")  # random weights, drawn the same way on every run
    page.page.click("#chat-send")
    reply = page.page.wait_for_selector(
        "#chat-log li.assistant[data-state=played]", state="attached", timeout=60_000
    )
    result = page.data("#chat-log li.assistant")
    assert result["sampleRate"] == "24000" and int(result["samples"]) > 0
    assert float(result["playedSeconds"]) >= int(result["samples"]) / 24000 - 0.01
    assert reply.query_selector("audio") is not None and reply.inner_text().strip()
    assert (
        sent[0]["audio"] == {"format": "wav", "voice": "chelsie"}
        and sent[0]["max_tokens"] == 8
        and sent[0]["seed"] == 7
    )

    page.page.fill("#chat-input", "And then?")
    page.page.uncheck("#chat-speak")
    page.page.click("#chat-send")
    page.page.wait_for_selector(
        "#chat-log li.assistant:nth-child(4)[data-state=done]", state="attached", timeout=60_000
    )
    roles = [message["role"] for message in sent[1]["messages"]]
    assert roles == ["user", "assistant", "user"] and "modalities" not in sent[1]
    assert sent[1]["messages"][1]["content"] == reply.query_selector(".text").text_content()
    assert page.page.input_value("#chat-input") == ""
    assert page.errors == []
