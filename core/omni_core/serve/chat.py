"""POST /v1/chat/completions: text, audio and image inputs; text or text + audio replies;
optionally streamed as SSE chunks ending with usage and ``[DONE]``."""

from __future__ import annotations

import asyncio
import base64
import time
import uuid

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from omni_core.api import to_numpy
from omni_core.pipeline import RequestFailed
from omni_core.playback import PlaybackBuffer
from omni_core.serve.protocol import ChatRequest
from omni_core.serve.streaming import (
    RequestAborted,
    SlotStreamingResponse,
    all_events,
    collect,
    error_event,
    events_with_first,
)
from omni_core.serve.text_formats import sse
from omni_core.surface.audio_codecs import StreamEncoder, encode_audio

router = APIRouter()
ENDPOINT = "/v1/chat/completions"
_FORMATS = {"pcm16": "pcm"}  # OpenAI's chat audio format names -> ours


def _usage(final: dict) -> dict:
    usage = dict(final.get("usage") or {})
    usage.setdefault("prompt_tokens", 0)
    usage.setdefault("completion_tokens", 0)
    usage.setdefault("total_tokens", usage["prompt_tokens"] + usage["completion_tokens"])
    return usage


@router.post(ENDPOINT)
async def create_chat_completion(body: ChatRequest, request: Request):
    state = request.app.state.omni_state
    state.check_model(body.model)
    wants_audio = "audio" in body.modalities
    audio_options = body.audio
    fmt = _FORMATS.get(audio_options.format, audio_options.format) if audio_options else "wav"
    voice = audio_options.voice if audio_options else None
    voice = voice.id if hasattr(voice, "id") else voice
    messages = [m.model_dump() for m in body.messages]
    slot = await state.admit(ENDPOINT, request)
    streaming = False
    try:
        omni = state.ready_omni()
        inputs = await asyncio.to_thread(
            omni.chat_inputs, messages, modalities=body.modalities, voice=voice, sampling=body.sampling(), local_parts=False
        )
        handle = slot.track(omni.submit(inputs, deadline=slot.deadline))
        reply = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": state.config.served_model_name,
        }
        if not body.stream:
            events = await collect(request, handle)
            return JSONResponse(await _complete(omni, reply, events, wants_audio, fmt))
        first, rest = await events_with_first(request, handle)
        streaming = True
    finally:
        if not streaming:
            await slot.release()
    chunks = _stream(state, slot, reply, first, rest, wants_audio, fmt, omni.sample_rate, body)
    return SlotStreamingResponse(chunks, slot, media_type="text/event-stream")


async def _complete(omni, reply: dict, events, wants_audio: bool, fmt: str) -> dict:
    final = next((e.payload for e in events if e.name == "text" and e.end), {})
    deltas = "".join(e.payload.get("text", "") for e in events if e.name == "text" and not e.end)
    text = final.get("text", deltas)
    message: dict = {"role": "assistant", "content": text}
    if wants_audio:
        parts = [to_numpy(e.payload["audio"]) for e in events if e.name == "audio" and "audio" in e.payload]
        audio = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        data = await asyncio.to_thread(encode_audio, audio, omni.sample_rate, fmt)
        message["content"] = None  # as OpenAI: the words travel as the audio's transcript
        message["audio"] = {
            "id": f"audio_{uuid.uuid4().hex}",
            "data": base64.b64encode(data).decode(),
            "expires_at": int(time.time()) + 3600,
            "transcript": text,
        }
    return {
        **reply,
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": final.get("finish_reason", "stop"), "logprobs": None}],
        "usage": _usage(final),
    }


def _chunk(reply: dict, delta: dict, finish: str | None = None) -> bytes:
    return sse(
        {
            **reply,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


async def _stream(state, slot, reply, first, rest, wants_audio: bool, fmt: str, rate: int, body: ChatRequest):
    audio_id = f"audio_{uuid.uuid4().hex}"
    encoder = StreamEncoder(fmt, rate) if wants_audio else None
    final: dict = {}
    first_audio_at = None
    playback = PlaybackBuffer()

    yield _chunk(reply, {"role": "assistant", "content": ""})
    try:
        async for event in all_events(first, rest, slot.handle):
            payload = event.payload
            if event.name == "text":
                if event.end:
                    final = payload
                elif payload.get("text"):
                    delta = (
                        {"audio": {"id": audio_id, "transcript": payload["text"]}}
                        if wants_audio
                        else {"content": payload["text"]}
                    )
                    yield _chunk(reply, delta)
            elif event.name == "audio" and encoder is not None and "audio" in payload:
                audio = to_numpy(payload["audio"])
                playback.hold(len(audio) / rate)  # an encoder may hold it back (opus pages)
                data = encoder.feed(audio)
                if data:
                    first_audio_at = first_audio_at or time.perf_counter()
                    playback.send(time.perf_counter())
                    yield _chunk(reply, {"audio": {"id": audio_id, "data": base64.b64encode(data).decode()}})
        if encoder is not None:
            tail = encoder.close()
            if tail:
                playback.send(time.perf_counter())
                yield _chunk(reply, {"audio": {"id": audio_id, "data": base64.b64encode(tail).decode()}})
    except (RequestFailed, RequestAborted) as exc:
        yield sse({"error": error_event(exc)["error"]})
        return
    finally:
        if encoder is not None:
            encoder.discard()
    if first_audio_at is not None:
        state.metrics.first_audio.labels(ENDPOINT).observe(first_audio_at - slot.started)
        state.metrics.observe_playback(ENDPOINT, playback)
    yield _chunk(reply, {}, finish=final.get("finish_reason", "stop"))
    if body.stream_options is None or body.stream_options.include_usage:
        yield sse({**reply, "object": "chat.completion.chunk", "choices": [], "usage": _usage(final)})
    yield sse("[DONE]")
