"""What speech and conversation sessions share: ``session.update`` (the voice checked against the
served model), ``response.create`` and ``response.cancel``, and the worker that runs responses
one at a time through the family's pipeline, streaming each one's text and audio as it is made.

A session subclass says what a response is made of: ``plan`` (at ``response.create``: what the
response will say or answer, refused there with an ``error`` event when it cannot be made) and
``inputs`` (the pipeline's entry payload for it), and what follows one (``finished``).
"""

from __future__ import annotations

import asyncio
import logging

from omni_core.api import to_numpy
from omni_core.serve.errors import APIError
from omni_core.serve.realtime.realtime_config import (
    RealtimeConfig,
    read_max_tokens,
    read_modalities,
    read_voice,
    updated,
)
from omni_core.serve.realtime.responses import (
    CANCELLED_BY_CLIENT,
    Response,
    usage_of,
)
from omni_core.serve.realtime.session import RealtimeSession
from omni_core.serve.realtime.session_config import as_object, refuse
from omni_core.serve.realtime.sockets import REQUEST_ERRORS, error_event_of
from omni_core.serve.streaming import drained
from omni_core.surface.audio_codecs import StreamEncoder

log = logging.getLogger("omni.serve")


class RespondingSession(RealtimeSession):
    def __init__(self, socket, config):
        super().__init__(socket, config)
        self.pending: asyncio.Queue = asyncio.Queue()  # (Response, plan) waiting to run
        self.queued: list[Response] = []
        self.current: Response | None = None

    def busy(self) -> bool:
        return self.current is not None or bool(self.queued)

    def handlers(self) -> dict:
        return {
            **super().handlers(),
            "response.create": self._response_create,
            "response.cancel": self._response_cancel,
        }

    # -- what a subclass says -------------------------------------------------------------------

    def plan(self, response: Response, params: dict):
        """What the response is made of (``params``: ``response.create``'s ``response``)."""
        raise NotImplementedError

    def inputs(self, omni, response: Response, plan) -> dict:
        """The pipeline's entry payload (run on a worker thread)."""
        raise NotImplementedError

    async def started(self, response: Response, plan) -> None:
        """Called once the response's events have begun (a speech session tells its transcript)."""

    def finished(self, response: Response, plan, status: str) -> None:
        """Called once the response has ended, however."""

    # -- client events --------------------------------------------------------------------------

    def check_voice(self, voice: str | None, param: str) -> None:
        if voice is not None:
            self.state.ready_omni().resolve_voice(voice, param)  # unknown: InvalidInput, unknown_voice

    def updated(self, session) -> RealtimeConfig:
        return updated(self.config, session)

    def configured(self, config: RealtimeConfig) -> None:
        if config.voice != self.config.voice:
            self.check_voice(config.voice, "session.audio.output.voice")

    async def _response_create(self, event: dict) -> None:
        if self.current is not None or self.queued:
            raise APIError(
                400,
                "a response is in progress: wait for its response.done, or cancel it (response.cancel)",
                code="conversation_already_has_active_response",
            )
        params = as_object(event.get("response") or {}, "response")
        await self.queue(self._new_response(params), params)

    def _new_response(self, params: dict) -> Response:
        config = self.config
        audio = as_object(as_object(params.get("audio") or {}, "response.audio").get("output") or {},
                          "response.audio.output")
        voice = config.voice
        if "voice" in audio:
            voice = read_voice(audio["voice"], "response.audio.output.voice")
            self.check_voice(voice, "response.audio.output.voice")
        modalities = config.output_modalities
        if params.get("output_modalities") is not None:
            modalities = read_modalities(
                params["output_modalities"], config.mode, "response.output_modalities"
            )
        max_tokens = config.max_output_tokens
        if "max_output_tokens" in params:
            max_tokens = read_max_tokens(params["max_output_tokens"], "response")
        instructions = config.instructions
        if params.get("instructions") is not None:
            if not isinstance(params["instructions"], str):
                raise refuse("response.instructions must be a string", "response.instructions")
            instructions = params["instructions"] or None
        conversation = params.get("conversation", "auto")
        if conversation not in ("auto", "none", None):
            raise refuse('response.conversation must be "auto" or "none"', "response.conversation")
        return Response(
            self.send, modalities=modalities, voice=voice, output_rate=config.output_rate,
            max_output_tokens=max_tokens, instructions=instructions, in_conversation=conversation != "none",
        )

    async def queue(self, response: Response, params: dict) -> None:
        plan = self.plan(response, params)
        response.cancel_with = self.socket.done_with
        self.queued.append(response)
        await self.pending.put((response, plan))

    async def _response_cancel(self, event: dict) -> None:
        wanted = event.get("response_id")
        if not self.cancel_responses(CANCELLED_BY_CLIENT, wanted):
            which = f"response {wanted!r}" if wanted else "response"
            raise APIError(400, f"no {which} in progress to cancel", param="response_id",
                           code="response_cancel_not_active")

    def cancel_responses(self, reason: str, wanted: str | None = None) -> bool:
        """Cancels the response in progress and those waiting (or only ``wanted``); whether any was."""
        cancelled = False
        for response in [self.current, *self.queued]:
            if response is not None and response.cancelled is None and wanted in (None, response.id):
                response.cancel(reason)
                cancelled = True
        return cancelled

    # -- the worker ------------------------------------------------------------------------------

    async def work(self) -> None:
        """Runs each response, in order, as they are asked for."""
        while True:
            response, plan = await self.pending.get()
            self.current = response
            if response in self.queued:
                self.queued.remove(response)
            previous = self.previous_item
            if response.in_conversation:
                self.previous_item = response.item_id
            status = "failed"
            try:
                status = await self._run(response, plan, previous)
            finally:
                self.current = None
                self.finished(response, plan, status)
                # no words, no item: the next items follow the one the response followed
                if response.in_conversation and not response.text and self.previous_item == response.item_id:
                    self.previous_item = previous

    async def _run(self, response: Response, plan, previous: str | None) -> str:
        await response.begin(previous)
        await self.started(response, plan)
        final, details, status = {}, None, "completed"
        speech_usage: dict = {}  # a speech family's usage rides on its audio events

        async def on_event(event) -> None:
            nonlocal final
            payload = event.payload
            if event.name == "text":
                if event.end:
                    final = payload
                elif payload.get("text"):
                    await response.text_delta(payload["text"])
            elif event.name == "audio":
                speech_usage.update(payload.get("usage") or {})  # the latest is the whole
                if "audio" in payload:
                    await response.audio_delta(encoder.feed(to_numpy(payload["audio"])))

        async def submitted(handle) -> None:
            response.handle = handle

        try:
            omni = self.state.ready_omni()
            rate = response.output_rate
            encoder = StreamEncoder("pcm", omni.sample_rate or rate, out_rate=rate)
            handle = await self.socket.run_request(
                omni, lambda: self.inputs(omni, response, plan), on_event,
                wanted=lambda: response.cancelled is None, on_submit=submitted,
            )
            if response.cancelled is None:
                await response.audio_delta(encoder.close())
                if handle.aborted:  # stopped from outside: the server drains
                    raise drained()
        except REQUEST_ERRORS as exc:
            if response.cancelled is None:
                error = error_event_of(exc)["error"]
                status = "failed"
                details = {"type": "failed", "error": {k: error[k] for k in ("type", "code", "message")}}
        if response.cancelled is not None:
            status, details = "cancelled", {"type": "cancelled", "reason": response.cancelled}
        elif status == "completed" and final.get("finish_reason") == "length":
            status, details = "incomplete", {"type": "incomplete", "reason": "max_output_tokens"}
        if status == "completed" and response.audio:
            seconds = response.audio_bytes / 2 / response.output_rate
            self.state.metrics.audio_seconds.labels(self.socket.endpoint).inc(seconds)
        await response.end(previous, status, details, usage_of({"usage": final.get("usage") or speech_usage}))
        return status
