"""/v1/audio/voices: list built-in and saved voices, save one from a reference clip, delete one."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from omni_core.serve.errors import APIError
from omni_core.serve.transcriptions import read_upload
from omni_core.surface.inputs import check_optional_text
from omni_core.surface.voices_store import VoiceStoreError

router = APIRouter()


def _store(state):
    omni = state.ready_omni()
    if omni.voice_store is None:
        raise APIError(400, "this server has no voices directory (--voices-dir)", code="voices_disabled")
    return omni, omni.voice_store


@router.get("/v1/audio/voices")
async def list_voices(request: Request):
    omni = request.app.state.omni_state.ready_omni()
    builtin = [
        {"id": v.id, "name": v.name, "object": "audio.voice", "type": "builtin", "description": v.description}
        for v in omni.builtin_voices()
    ]
    saved = [v.to_json() for v in omni.voice_store.list()] if omni.voice_store else []
    return {"object": "list", "data": builtin + saved}


@router.post("/v1/audio/voices")
async def create_voice(request: Request):
    state = request.app.state.omni_state
    omni, _ = _store(state)
    form, data = await read_upload(request, state.config.limits.max_upload_mb)
    name = form.get("name")
    text = form.get("text") or form.get("reference_text")
    if not isinstance(name, str) or not name.strip():
        raise APIError(400, "name is required", param="name", code="missing_required_parameter")
    if not isinstance(text, str) or not text.strip():
        raise APIError(
            400,
            "text (the transcript of the reference audio) is required",
            param="text",
            code="missing_required_parameter",
        )
    check_optional_text(text, state.config.limits, "text")
    try:
        voice = await asyncio.to_thread(omni.save_voice, name.strip(), data, None, text.strip(), param="file")
    except VoiceStoreError as exc:
        raise APIError(400, str(exc), param="name") from None
    return voice.to_json()


@router.delete("/v1/audio/voices/{voice_id}")
async def delete_voice(voice_id: str, request: Request):
    omni, store = _store(request.app.state.omni_state)
    if any(voice_id == v.id for v in omni.builtin_voices()):
        raise APIError(400, f"{voice_id!r} is a built-in voice and cannot be deleted", param="voice_id")
    if not await asyncio.to_thread(store.delete, voice_id):
        raise APIError(
            404,
            f"no saved voice with id {voice_id!r}",
            type="not_found_error",
            param="voice_id",
            code="voice_not_found",
        )
    return {"id": voice_id, "object": "audio.voice", "deleted": True}
