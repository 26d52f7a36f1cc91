"""WebSocket /v1/realtime?model=...: OpenAI's Realtime API. The served family's tasks pick the
session a socket opens: one that chats gets conversation sessions, one that speaks (and does not
chat) speech sessions, one that only transcribes transcription sessions. ``?intent=transcription``
(OpenAI's name for it) asks for a transcription session where the family transcribes as well.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, WebSocket

from omni_core.serve.errors import APIError, unknown_model
from omni_core.serve.realtime import vad
from omni_core.serve.realtime.conversation_session import ConversationSession
from omni_core.serve.realtime.realtime_config import CONVERSATION, SPEECH, RealtimeConfig
from omni_core.serve.realtime.session_config import SessionConfig
from omni_core.serve.realtime.sockets import Socket, SocketClosed, error_event_of, run_until_closed
from omni_core.serve.realtime.speech_session import SpeechSession
from omni_core.serve.realtime.transcription_session import TranscriptionSession
from omni_core.serve.realtime.turns import ServerVad

router = APIRouter()
ENDPOINT = "/v1/realtime"
TRANSCRIPTION = "transcription"
log = logging.getLogger("omni.serve")


def session_kind(tasks, intent: str | None) -> str | None:
    """The kind of session a family with ``tasks`` serves (None: none)."""
    if intent == TRANSCRIPTION:
        return TRANSCRIPTION if TRANSCRIPTION in tasks else None
    if "chat" in tasks:
        return CONVERSATION
    if "speech" in tasks:
        return SPEECH
    return TRANSCRIPTION if TRANSCRIPTION in tasks else None


def _handshake_check(state, model: str | None, intent: str | None):
    def check() -> None:
        omni = state.ready_omni()
        if model is not None and model != state.config.served_model_name:
            raise unknown_model(model, state.config.served_model_name)
        if intent not in (None, TRANSCRIPTION):
            raise APIError(400, f"intent must be transcription or left out, not {intent!r}", param="intent")
        if session_kind(omni.tasks, intent) is None:
            wanted = "transcribe" if intent else "transcribe, speak or chat"
            raise APIError(
                400,
                f"{state.config.served_model_name!r} does not {wanted}: /v1/realtime has no session for it",
                param="model",
                code="unsupported_task",
            )

    return check


def _vad_or_none() -> ServerVad | None:
    """Server VAD on by default, as OpenAI's; off where the realtime extra is missing."""
    try:
        vad.load()
        return ServerVad()
    except vad.VadUnavailable:
        return None


def _session(socket: Socket, intent: str | None):
    state = socket.state
    omni = state.ready_omni()
    name = state.config.served_model_name
    kind = session_kind(omni.tasks, intent)
    if kind == TRANSCRIPTION:
        return TranscriptionSession(socket, SessionConfig(model=name, turn_detection=_vad_or_none()))
    if kind == SPEECH:
        voices = omni.builtin_voices()
        config = RealtimeConfig(model=name, mode=SPEECH, voice=voices[0].id if voices else None)
        return SpeechSession(socket, config)
    config = RealtimeConfig(model=name, mode=CONVERSATION, turn_detection=_vad_or_none())
    return ConversationSession(socket, config)


@router.websocket(ENDPOINT)
async def realtime(websocket: WebSocket):
    state = websocket.app.state.omni_state
    intent = websocket.query_params.get("intent")
    socket = Socket(websocket, state, ENDPOINT)
    if not await socket.open(_handshake_check(state, websocket.query_params.get("model"), intent)):
        return
    try:
        session = _session(socket, intent)
    except Exception as error:  # a drain begun since the handshake, a VAD model that fails to load
        log.warning("%s: no session could be made: %r", ENDPOINT, error)
        try:
            await socket.send(error_event_of(error))
        except SocketClosed:
            pass
        await socket.close(1011, "no session could be made")  # its slot goes back
        return
    await run_until_closed(socket, ENDPOINT, session.receive(), session.work())
