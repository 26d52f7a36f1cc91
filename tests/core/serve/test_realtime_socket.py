"""/v1/realtime on the shared real server (the test family chats: conversation sessions): a refused
item is answered as the HTTP API answers the same content, and the socket stays open."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
from websockets.sync.client import connect

from tests.core.serve.server import API_KEY, tone_wav

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
RATE = 24000  # the session's input rate (OpenAI's default)


def _audio_item(seconds: float) -> dict:
    pcm = np.zeros(int(seconds * RATE), "<i2").tobytes()
    part = {"type": "input_audio", "audio": base64.b64encode(pcm).decode()}
    return {"type": "message", "role": "user", "content": [part]}


def test_input_audio_past_the_limit_is_too_large_as_over_http(api_server):  # --max-audio-seconds 20
    wav = base64.b64encode(tone_wav(21.0, rate=8000)).decode()
    part = {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}
    body = {"model": "testfamily", "messages": [{"role": "user", "content": [part]}]}
    http = httpx.post(f"{api_server.url}/v1/chat/completions", json=body, headers=HEADERS, timeout=30)
    assert http.status_code == 413 and http.json()["error"]["code"] == "too_large", http.text

    url = api_server.url.replace("http://", "ws://") + "/v1/realtime?model=testfamily"
    with connect(url, additional_headers=HEADERS, open_timeout=30) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
        create = {"type": "conversation.item.create", "event_id": "evt_long", "item": _audio_item(21.0)}
        ws.send(json.dumps(create))
        event = json.loads(ws.recv(timeout=30))
        assert event["type"] == "error", event
        assert (event["error"]["code"], event["error"]["param"]) == ("too_large", "item.content[0].audio")
        assert event["error"]["event_id"] == "evt_long"
        ws.send(json.dumps({"type": "conversation.item.create", "item": _audio_item(1.0)}))
        assert json.loads(ws.recv(timeout=30))["type"] == "conversation.item.added"  # still open
