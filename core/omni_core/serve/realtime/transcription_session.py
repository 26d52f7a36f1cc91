"""WebSocket /v1/realtime?model=...: OpenAI Realtime API transcription sessions, for any family
that transcribes.

The client streams pcm16 audio (``input_audio_buffer.append``); turns are committed by server
VAD (Silero, ``turns.py``) or by the client (``input_audio_buffer.commit``); each committed turn
is transcribed through the family's transcription path (``Omni.transcription_inputs`` and
``Omni.submit``, as POST /v1/audio/transcriptions) and its text comes back as
``conversation.item.input_audio_transcription.delta`` events as the family streams it, then
``.completed``. Turns are transcribed one at a time, in order, while audio keeps coming.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np
from fastapi import APIRouter, WebSocket

from omni_core.pipeline import RequestFailed
from omni_core.serve.errors import APIError, unknown_model
from omni_core.serve.exceptions import InvalidInput
from omni_core.serve.realtime import vad
from omni_core.serve.realtime.input_audio import InputAudioBuffer, decode_pcm16
from omni_core.serve.realtime.session_config import SessionConfig, updated
from omni_core.serve.realtime.sockets import (
    Socket,
    error_event,
    error_event_of,
    new_id,
    run_until_closed,
)
from omni_core.serve.realtime.turns import TurnDetector
from omni_core.serve.realtime.vad import RATE, WINDOW

router = APIRouter()
ENDPOINT = "/v1/realtime"
MIN_COMMIT_MS = 100  # as OpenAI: a shorter buffer is refused on commit
TURNS_WAITING = 4
log = logging.getLogger("omni.serve")


class TranscriptionSession:
    def __init__(self, socket: Socket, config: SessionConfig):
        self.socket = socket
        self.state = socket.state
        self.config = config
        self.session_id = new_id("sess")
        self.buffer = InputAudioBuffer(config.rate, self.state.config.limits.max_audio_seconds)
        self.detector = TurnDetector(config.turn_detection) if config.turn_detection else None
        self.speech_item: str | None = None  # the item of the turn server VAD has open
        self.previous_item: str | None = None
        # committed turns waiting to be transcribed: past the bound, taking more audio waits (the
        # socket is not read), so a client sending faster than real time cannot pile them up
        self.turns: asyncio.Queue = asyncio.Queue(maxsize=TURNS_WAITING)
        self.transcribing = False

    def busy(self) -> bool:
        return self.transcribing or not self.turns.empty()

    async def send(self, kind: str, **fields) -> None:
        await self.socket.send({"type": kind, "event_id": new_id("event"), **fields})

    # -- client events ---------------------------------------------------------------------------

    async def receive(self) -> None:
        await self.send("session.created", session=self.config.describe(self.session_id))
        handlers = {
            "session.update": self._session_update,
            "input_audio_buffer.append": self._append,
            "input_audio_buffer.commit": self._commit,
            "input_audio_buffer.clear": self._clear,
        }
        while True:
            event, refused = await self.socket.receive_json(self.busy)
            if refused is not None:
                await self.socket.send(error_event(refused, "invalid_event"))
                continue
            kind = event.get("type")
            client_event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
            handler = handlers.get(kind)
            if handler is None:
                await self.socket.send(
                    error_event(
                        f"unknown or unsupported event type {kind!r} in a transcription session; "
                        f"send one of {', '.join(handlers)}",
                        "unknown_event",
                        param="type",
                        event_id=client_event_id,
                    )
                )
                continue
            try:
                await handler(event)
            except (APIError, InvalidInput) as exc:
                await self.socket.send(error_event_of(exc, client_event_id))

    async def _session_update(self, event: dict) -> None:
        config = updated(self.config, event.get("session"))
        if config.turn_detection is not None and self.detector is None:
            try:
                vad.load()
            except vad.VadUnavailable as exc:
                raise APIError(
                    400, str(exc), param="session.audio.input.turn_detection", code="vad_unavailable"
                ) from None
        self.config = config
        self.buffer.set_rate(config.rate)
        if config.turn_detection is None:
            self.detector = None
            self.speech_item = None
        elif self.detector is None:
            self.detector = TurnDetector(config.turn_detection)
            self.detector.windows = self.buffer.end // WINDOW  # positions go on from here
        else:
            self.detector.settings = config.turn_detection
        await self.send("session.updated", session=config.describe(self.session_id))

    async def _append(self, event: dict) -> None:
        samples = self.buffer.to_16k(decode_pcm16(event.get("audio")))
        if len(samples) > self.buffer.room():
            if self.speech_item is None or len(samples) > self.buffer.max_samples:
                raise APIError(
                    413,
                    f"the input audio buffer holds at most {self.buffer.max_samples / RATE:g} s "
                    "(--max-audio-seconds): commit or clear it",
                    param="audio",
                    code="input_audio_buffer_full",
                )
            await self._speech_stopped(self.buffer.end)  # a turn that long is cut where the buffer is full
        self.buffer.append(samples)
        if self.detector is None:
            return
        for boundary in await asyncio.to_thread(self.detector.feed, samples):
            if boundary.kind == "started":
                self.buffer.drop_before(boundary.sample)
                self.speech_item = new_id("item")
                await self.send(
                    "input_audio_buffer.speech_started",
                    audio_start_ms=boundary.sample * 1000 // RATE,
                    item_id=self.speech_item,
                )
            elif self.speech_item is not None:
                await self._speech_stopped(boundary.sample)
        if self.speech_item is None:  # between turns: keep what the next one's padding may need
            padding = self.config.turn_detection.prefix_padding_ms * RATE // 1000
            self.buffer.drop_before(self.detector.windows * WINDOW - padding)

    async def _speech_stopped(self, end: int) -> None:
        item, self.speech_item = self.speech_item, None
        if self.detector is not None:
            self.detector.speaking = False
        await self.send("input_audio_buffer.speech_stopped", audio_end_ms=end * 1000 // RATE, item_id=item)
        await self._committed(item, self.buffer.take(end))

    async def _commit(self, event: dict) -> None:
        tail = self.buffer.flush()
        if self.detector is not None and len(tail):  # it reads every sample: positions stay aligned
            await asyncio.to_thread(self.detector.feed, tail)
        if self.buffer.seconds * 1000 < MIN_COMMIT_MS:
            raise APIError(
                400,
                f"buffer too small: expected at least {MIN_COMMIT_MS} ms of audio, "
                f"have {self.buffer.seconds * 1000:.0f} ms",
                code="input_audio_buffer_commit_empty",
            )
        item = self.speech_item or new_id("item")
        self.speech_item = None
        if self.detector is not None:
            self.detector.speaking = False
        await self._committed(item, self.buffer.take())

    async def _committed(self, item: str, samples: np.ndarray) -> None:
        await self.send("input_audio_buffer.committed", item_id=item, previous_item_id=self.previous_item)
        # the user message the turn becomes, as OpenAI's API adds it to the conversation (its
        # transcript comes with the transcription events)
        message = {
            "id": item,
            "object": "realtime.item",
            "type": "message",
            "status": "completed",
            "role": "user",
            "content": [{"type": "input_audio", "transcript": None}],
        }
        await self.send("conversation.item.added", previous_item_id=self.previous_item, item=message)
        await self.send("conversation.item.done", previous_item_id=self.previous_item, item=message)
        self.previous_item = item
        await self.turns.put((item, samples))

    async def _clear(self, event: dict) -> None:
        self.buffer.take()
        self.speech_item = None
        if self.detector is not None:
            self.detector.speaking = False
        await self.send("input_audio_buffer.cleared")

    # -- transcription ---------------------------------------------------------------------------

    async def transcribe(self) -> None:
        """Transcribes each committed turn, in order, as they come."""
        while True:
            item, samples = await self.turns.get()
            self.transcribing = True
            try:
                await self._transcribe_one(item, samples)
            finally:
                self.transcribing = False

    async def _transcribe_one(self, item: str, samples: np.ndarray) -> None:
        config = self.config
        handle = None
        try:
            omni = self.state.ready_omni()
            inputs = await asyncio.to_thread(
                omni.transcription_inputs, samples, RATE, language=config.language, prompt=config.prompt
            )
            handle = self.socket.track(omni.submit(inputs, deadline=self.socket.deadline()))
            text = ""
            async for event in handle:
                if event.name != "text":
                    continue
                if event.end:
                    text = event.payload.get("text", text)
                elif delta := event.payload.get("text"):
                    await self.send(
                        "conversation.item.input_audio_transcription.delta",
                        item_id=item,
                        content_index=0,
                        delta=delta,
                    )
            if handle.aborted:
                raise APIError(
                    503, "request aborted: the server is shutting down", type="server_error", code="aborted"
                )
        except (APIError, InvalidInput, RequestFailed) as exc:
            await self.send(
                "conversation.item.input_audio_transcription.failed",
                item_id=item,
                content_index=0,
                error=error_event_of(exc)["error"],
            )
            return
        finally:
            if handle is not None:
                self.socket.done_with(handle)
        seconds = len(samples) / RATE
        self.state.metrics.audio_seconds.labels(ENDPOINT).inc(seconds)
        await self.send(
            "conversation.item.input_audio_transcription.completed",
            item_id=item,
            content_index=0,
            transcript=text,
            usage={"type": "duration", "seconds": round(seconds, 3)},
        )


def _handshake_check(state, model: str | None):
    def check() -> None:
        omni = state.ready_omni()
        if model is not None and model != state.config.served_model_name:
            raise unknown_model(model, state.config.served_model_name)
        if "transcription" not in omni.tasks:
            raise APIError(
                400,
                f"{state.config.served_model_name!r} does not transcribe: /v1/realtime serves transcription "
                "sessions here",
                param="model",
                code="unsupported_task",
            )

    return check


@router.websocket(ENDPOINT)
async def realtime(websocket: WebSocket):
    state = websocket.app.state.omni_state
    socket = Socket(websocket, state, ENDPOINT)
    if not await socket.open(_handshake_check(state, websocket.query_params.get("model"))):
        return
    try:
        vad.load()
        config = SessionConfig(model=state.config.served_model_name)
    except vad.VadUnavailable:
        config = SessionConfig(model=state.config.served_model_name, turn_detection=None)
    session = TranscriptionSession(socket, config)
    await run_until_closed(socket, ENDPOINT, session.receive(), session.transcribe())
