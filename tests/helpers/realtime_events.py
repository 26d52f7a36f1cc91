"""/v1/realtime server events in tests: read through the openai SDK's connection up to a kind,
and checked against the SDK's own types (its client builds them without validation, so a
misnamed or missing field would go unseen in tests that read them through it)."""

from __future__ import annotations

import json

import pydantic
from openai.types.realtime import RealtimeServerEvent

_SERVER_EVENT = pydantic.TypeAdapter(RealtimeServerEvent)


def events_until_done(ws, client_events: list[dict], timeout: float = 120) -> list[dict]:
    """Sends ``client_events`` on a raw socket, then reads server events up to ``response.done``,
    each validated as the SDK's type of its name (``pydantic.ValidationError`` otherwise)."""
    for event in client_events:
        ws.send(json.dumps(event))
    events = []
    while not events or events[-1]["type"] != "response.done":
        events.append(json.loads(ws.recv(timeout=timeout)))
        _SERVER_EVENT.validate_python(events[-1])
    return events


def events_until(connection, *kinds: str) -> list:
    """Events from an SDK realtime ``connection`` up to and including the first of ``kinds`` (or an
    error)."""
    events = []
    while True:
        events.append(connection.recv())
        if events[-1].type in (*kinds, "error"):
            return events
