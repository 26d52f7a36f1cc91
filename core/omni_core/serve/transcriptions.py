"""POST /v1/audio/transcriptions and /v1/audio/translations: multipart upload -> json, text, srt,
vtt, verbose_json, or SSE. A translation is the same request with English text out (its optional
``language`` field names the speech's language)."""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.datastructures import UploadFile

from omni_core.pipeline import RequestFailed
from omni_core.serve.errors import APIError
from omni_core.serve.protocol import TRANSCRIPTION_FORMATS
from omni_core.serve.streaming import (
    RequestAborted,
    SlotStreamingResponse,
    all_events,
    collect,
    error_event,
    events_with_first,
)
from omni_core.serve.text_formats import sse, to_srt, to_vtt

router = APIRouter()
ENDPOINT = "/v1/audio/transcriptions"
TRANSLATIONS = "/v1/audio/translations"
_TRUE = ("true", "1", "yes", "on")


async def read_upload(request: Request, max_mb: float) -> tuple[object, bytes]:
    """The parsed form and the bytes of its ``file``; 413 past ``max_mb`` (checked before parsing
    when the client states a length, while receiving the body, and again on the bytes)."""
    limit = int(max_mb * 1024 * 1024)
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit + 64 * 1024:
        raise APIError(
            413,
            f"upload is {int(declared)} bytes; the limit is {max_mb:g} MB",
            param="file",
            code="too_large",
        )
    too_large = APIError(413, f"upload exceeds the limit of {max_mb:g} MB", param="file", code="too_large")
    try:
        form = await _body_limited(request, limit + 64 * 1024).form(max_files=1, max_fields=64)
    except _BodyTooLarge:
        raise too_large from None
    except Exception as exc:
        raise APIError(400, f"expected a multipart/form-data body: {exc}", param="file") from None
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        await form.close()
        raise APIError(
            400, "file is required (multipart field 'file')", param="file", code="missing_required_parameter"
        )
    data = await upload.read(limit + 1)
    await form.close()
    if len(data) > limit:
        raise too_large
    return form, data


class _BodyTooLarge(Exception):
    pass


def _body_limited(request: Request, limit: int) -> Request:
    """``request`` whose body stops being received past ``limit`` bytes: a client that states no
    length (a chunked upload) would otherwise have its whole body spooled to disk by the form
    parser before the size is known."""
    received = 0

    async def receive():
        nonlocal received
        message = await request.receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise _BodyTooLarge()
        return message

    return Request(request.scope, receive)


def _float(form, name: str, default: float) -> float:
    raw = form.get(name)
    if raw in (None, ""):
        return default
    try:
        return float(raw)
    except ValueError:
        raise APIError(400, f"{name} must be a number", param=name) from None


@router.post(ENDPOINT)
async def create_transcription(request: Request):
    return await _audio_to_text(request, ENDPOINT, "transcription")


@router.post(TRANSLATIONS)
async def create_translation(request: Request):
    return await _audio_to_text(request, TRANSLATIONS, "translation")


async def _audio_to_text(request: Request, endpoint: str, task: str):
    state = request.app.state.omni_state
    form, data = await read_upload(request, state.config.limits.max_upload_mb)
    state.check_model(form.get("model"))
    fmt = form.get("response_format") or "json"
    if fmt not in TRANSCRIPTION_FORMATS:
        raise APIError(
            400,
            f"unsupported response_format {fmt!r}; choose one of {list(TRANSCRIPTION_FORMATS)}",
            param="response_format",
        )
    granularities = form.getlist("timestamp_granularities[]") + form.getlist("timestamp_granularities")
    unknown = [g for g in granularities if g not in ("segment", "word")]
    if unknown:
        raise APIError(
            400,
            f"timestamp_granularities: unknown {unknown}; use segment or word",
            param="timestamp_granularities",
        )
    if granularities and fmt != "verbose_json":
        # as OpenAI's API: only verbose_json carries them (the others would decode with timestamps,
        # text can differ then, and align words, only to drop them)
        raise APIError(
            400, "timestamp_granularities need response_format verbose_json", param="timestamp_granularities"
        )
    stream = str(form.get("stream") or "").lower() in _TRUE
    if stream and fmt not in ("json", "text"):
        raise APIError(
            400, "stream=true returns text deltas: use response_format json or text", param="stream"
        )
    temperature = _float(form, "temperature", 0.0)
    slot = await state.admit(endpoint, request)
    streaming = False
    try:
        omni = state.ready_omni()
        inputs = await asyncio.to_thread(
            omni.transcription_inputs,
            data,
            language=form.get("language") or None,
            prompt=form.get("prompt") or None,
            temperature=temperature,
            timestamps=bool(granularities) or fmt in ("verbose_json", "srt", "vtt"),
            task=task,
            word_timestamps="word" in granularities,
        )
        seconds = len(inputs["audio"]) / (omni.spec.input_sample_rate or 16000)
        handle = slot.track(omni.submit(inputs, deadline=slot.deadline))
        if not stream:
            events = await collect(request, handle)
            final = next((e.payload for e in events if e.name == "text" and e.end), {})
            _observe(state, endpoint, slot.started, seconds)
            return _render(final, fmt, granularities, task)
        first, rest = await events_with_first(request, handle)
        streaming = True
    finally:
        if not streaming:
            await slot.release()
    return SlotStreamingResponse(
        _sse(state, endpoint, slot, first, rest, seconds), slot, media_type="text/event-stream"
    )


def _observe(state, endpoint: str, started: float, seconds: float) -> None:
    if seconds > 0:
        state.metrics.rtf.labels(endpoint).observe((time.perf_counter() - started) / seconds)
        state.metrics.audio_seconds.labels(endpoint).inc(seconds)


def _render(final: dict, fmt: str, granularities: list[str], task: str):
    text = final.get("text", "")
    segments = list(final.get("segments") or [])
    if fmt == "text":
        return PlainTextResponse(text)
    if fmt == "srt":
        return PlainTextResponse(to_srt(segments))
    if fmt == "vtt":
        return PlainTextResponse(to_vtt(segments), media_type="text/vtt")
    body = {"text": text}
    if final.get("usage"):
        body["usage"] = final["usage"]
    if fmt == "verbose_json":
        body = {
            "task": "translate" if task == "translation" else "transcribe",
            # named as OpenAI names it ("english") when the family gives the name, else its code
            "language": final.get("language_name") or final.get("language"),
            "duration": final.get("duration"),
            **body,
        }
        if not granularities or "segment" in granularities:
            body["segments"] = [{"id": i, **seg} for i, seg in enumerate(segments)]
        if "word" in granularities:
            body["words"] = [w for seg in segments for w in seg.get("words", [])]
    return JSONResponse(body)


async def _sse(state, endpoint: str, slot, first, rest, seconds: float):
    try:
        async for event in all_events(first, rest, slot.handle):
            if event.name != "text":
                continue
            if event.end:
                done = {"type": "transcript.text.done", "text": event.payload.get("text", "")}
                if event.payload.get("usage"):
                    done["usage"] = event.payload["usage"]
                _observe(state, endpoint, slot.started, seconds)
                yield sse(done)
            elif event.payload.get("text"):
                yield sse({"type": "transcript.text.delta", "delta": event.payload["text"]})
    except (RequestFailed, RequestAborted) as exc:
        yield sse(error_event(exc))
