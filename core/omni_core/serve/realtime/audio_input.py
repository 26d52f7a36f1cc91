"""A session's audio input: the ``input_audio_buffer.*`` client events, the buffer they fill and
server VAD cutting it into turns. Transcription and conversation sessions both take audio this
way; what a committed turn becomes (a transcript, a user message) is theirs to say, through
``on_turn``, and a turn starting (barge-in) through ``on_speech_started``. A committed turn is
the conversation's new last item (the session's ``previous_item``).

The client streams pcm16 audio (``input_audio_buffer.append``); turns are committed by server
VAD (Silero, ``turns.py``) or by the client (``input_audio_buffer.commit``). Each committed turn
is announced as OpenAI's API does (``input_audio_buffer.committed``, then the user message it
becomes as ``conversation.item.added`` and ``.done``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import numpy as np

from omni_core.serve.errors import APIError
from omni_core.serve.realtime import vad
from omni_core.serve.realtime.input_audio import InputAudioBuffer, decode_pcm16
from omni_core.serve.realtime.sockets import new_id
from omni_core.serve.realtime.turns import TurnDetector
from omni_core.serve.realtime.vad import RATE, WINDOW

MIN_COMMIT_MS = 100  # as OpenAI: a shorter buffer is refused on commit


async def _nothing(*_) -> None:
    return None


class AudioInput:
    """The audio of ``session`` (its settings have ``rate`` and ``turn_detection``, a ServerVad or
    None); ``on_turn(item, samples, by_vad)`` takes each committed turn (16 kHz float32);
    ``on_speech_started(item)`` hears server VAD open one."""

    def __init__(
        self,
        session,
        on_turn: Callable[[str, np.ndarray, bool], Awaitable[None]],
        on_speech_started: Callable[[str], Awaitable[None]] = _nothing,
    ):
        self.session = session
        self.send = session.send
        config = session.config
        self.buffer = InputAudioBuffer(config.rate, session.state.config.limits.max_audio_seconds)
        self.detector = TurnDetector(config.turn_detection) if config.turn_detection else None
        self.speech_item: str | None = None  # the item of the turn server VAD has open
        self.on_turn = on_turn
        self.on_speech_started = on_speech_started

    def handlers(self) -> dict:
        return {
            "input_audio_buffer.append": self._append,
            "input_audio_buffer.commit": self._commit,
            "input_audio_buffer.clear": self._clear,
        }

    def configure(self, config) -> None:
        """Takes a session's updated settings; server VAD where the realtime extra is missing is
        refused first (``APIError``), nothing changed."""
        if self.detector is None and config.turn_detection is not None:
            try:
                vad.load()
            except vad.VadUnavailable as exc:
                raise APIError(
                    400, str(exc), param="session.audio.input.turn_detection", code="vad_unavailable"
                ) from None
        self.buffer.set_rate(config.rate)
        if config.turn_detection is None:
            self.detector = None
            self.speech_item = None
        elif self.detector is None:
            self.detector = TurnDetector(config.turn_detection)
            self.detector.windows = self.buffer.end // WINDOW  # positions go on from here
        else:
            self.detector.settings = config.turn_detection

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
                await self.on_speech_started(self.speech_item)
            elif self.speech_item is not None:
                await self._speech_stopped(boundary.sample)
        if self.speech_item is None:  # between turns: keep what the next one's padding may need
            padding = self.session.config.turn_detection.prefix_padding_ms * RATE // 1000
            self.buffer.drop_before(self.detector.windows * WINDOW - padding)

    async def _speech_stopped(self, end: int) -> None:
        item, self.speech_item = self.speech_item, None
        if self.detector is not None:
            self.detector.speaking = False
        await self.send("input_audio_buffer.speech_stopped", audio_end_ms=end * 1000 // RATE, item_id=item)
        await self._committed(item, self.buffer.take(end), by_vad=True)

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
        await self._committed(item, self.buffer.take(), by_vad=False)

    async def _committed(self, item: str, samples: np.ndarray, by_vad: bool) -> None:
        previous = self.session.previous_item
        await self.send("input_audio_buffer.committed", item_id=item, previous_item_id=previous)
        # the user message the turn becomes, as OpenAI's API adds it to the conversation (its
        # transcript, where there is one, comes with the transcription events)
        message = {
            "id": item,
            "object": "realtime.item",
            "type": "message",
            "status": "completed",
            "role": "user",
            "content": [{"type": "input_audio", "transcript": None}],
        }
        await self.send("conversation.item.added", previous_item_id=previous, item=message)
        await self.send("conversation.item.done", previous_item_id=previous, item=message)
        self.session.previous_item = item
        await self.on_turn(item, samples, by_vad)

    async def _clear(self, event: dict) -> None:
        self.buffer.take()
        self.speech_item = None
        if self.detector is not None:
            self.detector.speaking = False
        await self.send("input_audio_buffer.cleared")
