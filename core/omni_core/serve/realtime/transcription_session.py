"""/v1/realtime transcription sessions (OpenAI Realtime API), for any family that transcribes.

Audio comes in through ``AudioInput`` (the buffer, server VAD or commits by hand); each committed
turn is transcribed through the family's transcription path (``Omni.transcription_inputs`` and
``Omni.submit``, as POST /v1/audio/transcriptions) and its text comes back as
``conversation.item.input_audio_transcription.delta`` events as the family streams it, then
``.completed``. Turns are transcribed one at a time, in order, while audio keeps coming.
"""

from __future__ import annotations

import asyncio

import numpy as np

from omni_core.serve.realtime.audio_input import AudioInput
from omni_core.serve.realtime.session import RealtimeSession
from omni_core.serve.realtime.session_config import SessionConfig, updated
from omni_core.serve.realtime.sockets import REQUEST_ERRORS, error_event_of
from omni_core.serve.realtime.vad import RATE
from omni_core.serve.streaming import drained

TURNS_WAITING = 4


class TranscriptionSession(RealtimeSession):
    kind = "transcription"

    def __init__(self, socket, config):
        super().__init__(socket, config)
        self.audio = AudioInput(self, self._turn)
        # committed turns waiting to be transcribed: past the bound, taking more audio waits (the
        # socket is not read), so a client sending faster than real time cannot pile them up
        self.turns: asyncio.Queue = asyncio.Queue(maxsize=TURNS_WAITING)
        self.transcribing = False

    def busy(self) -> bool:
        return self.transcribing or not self.turns.empty()

    def handlers(self) -> dict:
        return {**super().handlers(), **self.audio.handlers()}

    def updated(self, session) -> SessionConfig:
        return updated(self.config, session)

    def configured(self, config: SessionConfig) -> None:
        self.audio.configure(config)

    async def _turn(self, item: str, samples: np.ndarray, by_vad: bool) -> None:
        await self.turns.put((item, samples))

    async def work(self) -> None:
        """Transcribes each committed turn, in order, as they come."""
        while True:
            item, samples = await self.turns.get()
            self.transcribing = True
            try:
                await self._transcribe_one(item, samples)
            finally:
                self.transcribing = False

    async def _transcribe_one(self, item: str, samples: np.ndarray) -> None:
        language, prompt = self.config.language, self.config.prompt
        text = ""

        async def on_event(event) -> None:
            nonlocal text
            if event.name != "text":
                return
            if event.end:
                text = event.payload.get("text", text)
            elif delta := event.payload.get("text"):
                await self.send(
                    "conversation.item.input_audio_transcription.delta",
                    item_id=item,
                    content_index=0,
                    delta=delta,
                )

        try:
            omni = self.state.ready_omni()
            handle = await self.socket.run_request(
                omni,
                lambda: omni.transcription_inputs(samples, RATE, language=language, prompt=prompt),
                on_event,
            )
            if handle.aborted:
                raise drained()
        except REQUEST_ERRORS as exc:
            await self.send(
                "conversation.item.input_audio_transcription.failed",
                item_id=item,
                content_index=0,
                error=error_event_of(exc)["error"],
            )
            return
        seconds = len(samples) / RATE
        self.state.metrics.audio_seconds.labels(self.socket.endpoint).inc(seconds)
        await self.send(
            "conversation.item.input_audio_transcription.completed",
            item_id=item,
            content_index=0,
            transcript=text,
            usage={"type": "duration", "seconds": round(seconds, 3)},
        )
