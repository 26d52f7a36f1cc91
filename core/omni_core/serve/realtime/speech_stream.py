"""WebSocket /v1/audio/speech/stream: text in as it is written (an LLM's tokens), speech out
sentence by sentence as soon as each sentence is complete.

Client messages (JSON text frames):
  {"type": "config", "model", "voice", ...}  first; the fields of POST /v1/audio/speech but
                                              ``input`` and ``stream_format`` (response_format: pcm)
  {"type": "text", "text": "..."}             any number, any size of piece
  {"type": "end"}                             no more text: the rest is spoken, then "done"
Server messages:
  {"type": "ready", "sample_rate", "response_format": "pcm"}   the config is taken
  {"type": "sentence.start", "index", "text"}, binary frames of its audio (16-bit little-endian
  mono pcm at sample_rate), {"type": "sentence.done", "index", "audio_seconds"} for each
  sentence in order; {"type": "done", "sentences", "audio_seconds"}, then the socket closes.
  {"type": "error", "error": {...}} for a refused message (the socket stays open and nothing
  is lost) or a sentence that failed (with "index"; the next sentences are still spoken).

Sentences run one at a time through the family's speech path (``Omni.speech_inputs`` and
``Omni.submit``, so a family's own segmenting applies within one); a socket that closes aborts
the sentence in flight in every stage.
"""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, WebSocket
from pydantic import ValidationError

from omni_core.api import to_numpy
from omni_core.serve.errors import APIError
from omni_core.serve.exceptions import InvalidInput
from omni_core.serve.protocol import SpeechRequest
from omni_core.serve.realtime.sentences import SentenceCutter
from omni_core.serve.realtime.sockets import (
    REQUEST_ERRORS,
    Socket,
    error_event,
    error_event_of,
    run_until_closed,
)
from omni_core.serve.speech import speech_inputs, voice_of
from omni_core.serve.streaming import drained
from omni_core.surface.audio_codecs import StreamEncoder

router = APIRouter()
ENDPOINT = "/v1/audio/speech/stream"
log = logging.getLogger("omni.serve")

_END = object()


def _validation_error(exc: ValidationError) -> dict:
    first = exc.errors()[0]
    param = ".".join(str(part) for part in first.get("loc", ())) or None
    return error_event(
        f"{param}: {first.get('msg')}" if param else str(first.get("msg")), "invalid_config", param=param
    )


class SpeechStream:
    """One socket's text, sentences and speaker."""

    def __init__(self, socket: Socket):
        self.socket = socket
        self.state = socket.state
        self.config: SpeechRequest | None = None
        self.reference: bytes | None = None
        self.cutter = SentenceCutter()
        self.sentences: asyncio.Queue = asyncio.Queue()
        self.waiting_chars = 0  # text cut into sentences not yet spoken
        self.ended = False
        self.speaking = False
        self.spoken = 0
        self.audio_seconds = 0.0

    def busy(self) -> bool:
        return self.speaking or not self.sentences.empty()

    # -- the client's messages -------------------------------------------------------------------

    async def receive(self) -> None:
        while True:
            event, refused = await self.socket.receive_json(self.busy)
            if refused is not None:
                await self.socket.send(error_event(refused, "invalid_message"))
                continue
            kind = event.get("type")
            handler = {"config": self._config, "text": self._text, "end": self._end}.get(kind)
            if handler is None:
                await self.socket.send(
                    error_event(
                        f"unknown message type {kind!r}; send config, text or end",
                        "unknown_message_type",
                        param="type",
                    )
                )
                continue
            try:
                await handler(event)
            except (APIError, InvalidInput) as exc:
                await self.socket.send(error_event_of(exc))

    async def _config(self, event: dict) -> None:
        if self.config is not None:
            raise APIError(
                400, "the socket is configured already: config comes once", param="type", code="config_again"
            )
        fields = {k: v for k, v in event.items() if k != "type"}
        for field in ("input", "stream_format"):
            if field in fields:
                raise APIError(400, f"{field} is not a config field: send text in text messages", param=field)
        fields.setdefault("response_format", "pcm")
        try:
            config = SpeechRequest(input="", **fields)
        except ValidationError as exc:
            await self.socket.send(_validation_error(exc))
            return
        except TypeError as exc:
            raise APIError(400, f"config: {exc}") from None
        self.state.check_model(config.model)
        if config.response_format != "pcm":
            raise APIError(
                400,
                "the stream sends raw pcm (16-bit mono): response_format must be pcm",
                param="response_format",
            )
        reference = voice_of(config)
        omni = self.state.ready_omni()
        self.reference = reference
        # the voice is resolved once now, so a config naming an unknown voice is refused here
        await asyncio.to_thread(speech_inputs, omni, config, "Ready.", reference)
        self.config = config
        await self.socket.send({"type": "ready", "sample_rate": omni.sample_rate, "response_format": "pcm"})

    async def _text(self, event: dict) -> None:
        if self.config is None:
            raise APIError(400, "send a config message before text", param="type", code="config_missing")
        if self.ended:
            raise APIError(400, "text after end: the text has ended", param="type", code="text_after_end")
        text = event.get("text")
        if not isinstance(text, str):
            raise APIError(400, "text must be a string", param="text")
        limit = self.state.config.limits.max_input_chars
        if self.waiting_chars + len(text) > limit:
            raise APIError(
                413,
                f"more than {limit} characters waiting to be spoken: send the rest as speech catches up",
                param="text",
                code="too_large",
            )
        self._queue(self.cutter.feed(text))

    async def _end(self, event: dict) -> None:
        if self.config is None:
            raise APIError(400, "send a config message before end", param="type", code="config_missing")
        if self.ended:
            raise APIError(400, "the text has ended already", param="type", code="text_after_end")
        self.ended = True
        self._queue(self.cutter.finish())
        self.sentences.put_nowait(_END)

    def _queue(self, sentences: list[str]) -> None:
        for sentence in sentences:
            self.waiting_chars += len(sentence)
            self.sentences.put_nowait(sentence)

    # -- speaking -------------------------------------------------------------------------------

    async def speak(self) -> None:
        """Speaks each sentence as it comes, in order, until the end of the text."""
        index = 0
        while (sentence := await self.sentences.get()) is not _END:
            self.speaking = True
            try:
                await self._speak_one(index, sentence)
            finally:
                self.speaking = False
                self.waiting_chars -= len(sentence)
            index += 1
        await self.socket.send(
            {"type": "done", "sentences": self.spoken, "audio_seconds": round(self.audio_seconds, 3)}
        )

    async def _speak_one(self, index: int, sentence: str) -> None:
        samples = 0

        async def announce(handle) -> None:
            await self.socket.send({"type": "sentence.start", "index": index, "text": sentence})

        async def on_event(event) -> None:
            nonlocal samples
            if event.name == "audio" and "audio" in event.payload:
                audio = to_numpy(event.payload["audio"])
                samples += len(audio)
                if data := encoder.feed(audio):
                    await self.socket.send(data)

        try:
            omni = self.state.ready_omni()  # refuses once the server drains
            encoder = StreamEncoder("pcm", omni.sample_rate)
            handle = await self.socket.run_request(
                omni,
                lambda: speech_inputs(omni, self.config, sentence, self.reference),
                on_event,
                on_submit=announce,
            )
            if tail := encoder.close():
                await self.socket.send(tail)
        except REQUEST_ERRORS as exc:
            await self.socket.send({**error_event_of(exc), "index": index})
            return
        if handle.aborted:  # a drain: the server is shutting down (the error ends the socket)
            raise drained()
        seconds = samples / omni.sample_rate
        self.spoken += 1
        self.audio_seconds += seconds
        self.state.metrics.audio_seconds.labels(ENDPOINT).inc(seconds)
        await self.socket.send({"type": "sentence.done", "index": index, "audio_seconds": round(seconds, 3)})


@router.websocket(ENDPOINT)
async def speech_stream(websocket: WebSocket):
    socket = Socket(websocket, websocket.app.state.omni_state, ENDPOINT)
    if not await socket.open():
        return
    stream = SpeechStream(socket)
    await run_until_closed(socket, ENDPOINT, stream.receive(), stream.speak())
