"""POST /v1/audio/speech: text to speech, whole file, chunked audio stream, or SSE."""

from __future__ import annotations

import asyncio
import base64
import logging
import time

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from omni_core.api import to_numpy
from omni_core.pipeline import RequestFailed
from omni_core.playback import PlaybackBuffer
from omni_core.serve.errors import APIError
from omni_core.serve.protocol import SpeechRequest
from omni_core.serve.streaming import (
    RequestAborted,
    SlotStreamingResponse,
    StreamCut,
    all_events,
    collect,
    error_event,
    events_with_first,
)
from omni_core.serve.text_formats import sse
from omni_core.surface.audio_codecs import (
    CONTENT_TYPES,
    StreamEncoder,
    check_output_format,
    decode_base64,
    encode_audio,
)

router = APIRouter()
ENDPOINT = "/v1/audio/speech"


def _usage(usage: dict) -> dict:
    usage = dict(usage)
    if "input_tokens" in usage and "output_tokens" in usage:
        usage.setdefault("total_tokens", usage["input_tokens"] + usage["output_tokens"])
    return usage


def voice_of(body: SpeechRequest) -> bytes | None:
    """Checks that a speech request names a voice or brings a reference; its reference audio
    (decoded; an empty one is refused, as empty audio, not taken for none) or None."""
    if body.voice_name() is None and body.reference_audio is None:
        raise APIError(
            400,
            "voice is required unless reference_audio is given",
            param="voice",
            code="missing_required_parameter",
        )
    if body.reference_text is not None and body.reference_audio is None:
        raise APIError(400, "reference_text needs reference_audio", param="reference_text")
    return decode_base64(body.reference_audio, "reference_audio") if body.reference_audio is not None else None


def speech_inputs(omni, body: SpeechRequest, text: str, reference: bytes | None = None) -> dict:
    """The pipeline inputs of a speech request: its ``text`` (the input, or one sentence of it on
    the streamed-text socket) with the request's voice, reference, speed, seed and sampling."""
    return omni.speech_inputs(
        text,
        body.voice_name(),
        reference_audio=reference,
        reference_text=body.reference_text,
        instructions=body.instructions,
        speed=body.speed,
        seed=body.seed,
        sampling=body.sampling(),
    )


@router.post(ENDPOINT)
async def create_speech(body: SpeechRequest, request: Request):
    state = request.app.state.omni_state
    state.check_model(body.model)
    fmt = check_output_format(body.response_format)
    reference = voice_of(body)
    slot = await state.admit(ENDPOINT, request)
    streaming = False  # from here on the stream's generator releases the slot
    try:
        omni = state.ready_omni()
        inputs = await asyncio.to_thread(speech_inputs, omni, body, body.input, reference)
        handle = slot.track(omni.submit(inputs, deadline=slot.deadline))
        rate = omni.sample_rate
        if body.stream_format is None:
            events = await collect(request, handle)
            parts = [
                to_numpy(e.payload["audio"]) for e in events if e.name == "audio" and "audio" in e.payload
            ]
            audio = np.concatenate(parts) if parts else np.zeros(0, np.float32)
            _observe(state, slot.started, None, len(audio) / rate)
            content = await asyncio.to_thread(encode_audio, audio, rate, fmt)
            return Response(content, media_type=CONTENT_TYPES[fmt], headers=_rate_header(rate))
        first, rest = await events_with_first(request, handle)
        streaming = True
    finally:
        if not streaming:
            await slot.release()
    stream = _sse_stream if body.stream_format == "sse" else _audio_stream
    media = "text/event-stream" if body.stream_format == "sse" else CONTENT_TYPES[fmt]
    return SlotStreamingResponse(
        stream(state, slot, first, rest, fmt, rate), slot, media_type=media, headers=_rate_header(rate)
    )


def _rate_header(rate: int) -> dict[str, str]:
    # raw pcm carries no rate of its own: say it, so clients (omni bench) need not guess
    return {"X-Sample-Rate": str(rate)}


def _observe(state, started: float, first_audio_at: float | None, seconds: float) -> None:
    metrics = state.metrics
    elapsed = time.perf_counter() - started
    metrics.first_audio.labels(ENDPOINT).observe((first_audio_at or time.perf_counter()) - started)
    if seconds > 0:
        metrics.rtf.labels(ENDPOINT).observe(elapsed / seconds)
        metrics.audio_seconds.labels(ENDPOINT).inc(seconds)


async def _encoded(state, slot, first, rest, fmt: str, rate: int):
    """Encoded bytes as they are produced; records time to first audio and RTF at the end."""
    encoder = StreamEncoder(fmt, rate)
    samples = 0
    first_audio_at = None
    usage: dict = {}
    playback = PlaybackBuffer()
    try:
        async for event in all_events(first, rest, slot.handle):
            if event.name != "audio":
                continue
            usage.update(event.payload.get("usage") or {})
            if "audio" not in event.payload:
                continue
            audio = to_numpy(event.payload["audio"])
            samples += len(audio)
            playback.hold(len(audio) / rate)  # an encoder may hold it back (opus pages)
            data = encoder.feed(audio)
            if data:
                if first_audio_at is None:
                    first_audio_at = time.perf_counter()
                playback.send(time.perf_counter())
                yield data, usage
        tail = encoder.close()
        if tail:
            first_audio_at = first_audio_at or time.perf_counter()
            playback.send(time.perf_counter())
        yield tail, usage
        _observe(state, slot.started, first_audio_at, samples / rate)
        state.metrics.observe_playback(ENDPOINT, playback)
    finally:
        encoder.discard()  # nothing left to do after close(); closes it when the stream was cut
        await slot.release()


async def _audio_stream(state, slot, first, rest, fmt, rate):
    try:
        async for data, _ in _encoded(state, slot, first, rest, fmt, rate):
            if data:
                yield data
    except (RequestFailed, RequestAborted) as exc:
        # Headers are sent: breaking the chunked body is how a raw stream says "incomplete".
        level = logging.INFO if isinstance(exc, RequestAborted) else logging.WARNING  # a drain is no fault
        raise StreamCut(error_event(exc)["error"]["message"], level) from None


async def _sse_stream(state, slot, first, rest, fmt, rate):
    usage: dict = {}
    try:
        async for data, latest in _encoded(state, slot, first, rest, fmt, rate):
            usage = latest
            if data:
                yield sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
    except (RequestFailed, RequestAborted) as exc:
        yield sse(error_event(exc))
        return
    yield sse({"type": "speech.audio.done", "usage": _usage(usage)})
