"""One response of a speech or conversation session, as OpenAI's Realtime API tells it: one
assistant message item with one content part (audio with its transcript, or text), its deltas
as they are made, and the closing events, always sent, whatever the end (``completed``,
``cancelled``, ``incomplete`` or ``failed``).

Events in order: ``response.created``, ``response.output_item.added``,
``conversation.item.added``, ``response.content_part.added``; then
``response.output_audio_transcript.delta`` (or ``response.output_text.delta``) and
``response.output_audio.delta`` (base64 pcm16 at the session's output rate); then
``response.output_audio.done``, ``response.output_audio_transcript.done`` (or
``response.output_text.done``), ``response.content_part.done``, ``response.output_item.done``,
``conversation.item.done`` and ``response.done`` with the response's status and usage.

A response is cancelled (``response.cancel``, or speech starting: barge-in) by aborting its
request in every stage, at once: iterating its handle ends, and the closing events follow.
"""

from __future__ import annotations

import base64

from omni_core.serve.realtime.sockets import new_id

CANCELLED_BY_CLIENT, CANCELLED_BY_TURN = "client_cancelled", "turn_detected"


class Response:
    """``send`` writes a server event; the settings are the response's own (the session's, or
    those its ``response.create`` gave); ``in_conversation``: whether its item joins the
    conversation (``conversation: "none"`` keeps it out)."""

    def __init__(
        self,
        send,
        *,
        modalities: list[str],
        voice: str | None,
        output_rate: int,
        max_output_tokens: int | None,
        instructions: str | None = None,
        in_conversation: bool = True,
    ):
        self.send = send
        self.id = new_id("resp")
        self.item_id = new_id("item")
        self.modalities = modalities
        self.voice = voice
        self.output_rate = output_rate
        self.max_output_tokens = max_output_tokens
        self.in_conversation = in_conversation
        self.instructions = instructions  # the session's, or the response's own
        self.audio = "audio" in modalities
        self.text = ""  # the text, or the audio's transcript, so far
        self.audio_bytes = 0
        self.handle = None  # the pipeline request, once submitted
        self.cancelled: str | None = None  # why, once cancelled
        self.cancel_with = None  # aborts the handle (the socket's done_with: counts the abort)

    # -- what is sent ---------------------------------------------------------------------------

    def _where(self) -> dict:
        return {"response_id": self.id, "item_id": self.item_id, "output_index": 0, "content_index": 0}

    def _part(self) -> dict:
        if self.audio:
            return {"type": "audio", "transcript": self.text}
        return {"type": "text", "text": self.text}

    def item(self, status: str) -> dict:
        content = (
            [{"type": "output_audio", "transcript": self.text}] if self.audio
            else [{"type": "output_text", "text": self.text}]
        )
        if status == "in_progress":
            content = []
        return {"id": self.item_id, "object": "realtime.item", "type": "message", "status": status,
                "role": "assistant", "content": content}

    def resource(self, status: str, details: dict | None = None, usage: dict | None = None) -> dict:
        return {
            "id": self.id,
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "output": [] if status == "in_progress" else [self.item(_item_status(status))],
            "conversation_id": "conv_default" if self.in_conversation else None,
            "output_modalities": list(self.modalities),
            "max_output_tokens": "inf" if self.max_output_tokens is None else self.max_output_tokens,
            "audio": {
                "output": {"format": {"type": "audio/pcm", "rate": self.output_rate}, "voice": self.voice}
            },
            "usage": usage,
            "metadata": None,
        }

    async def begin(self, previous_item: str | None) -> None:
        await self.send("response.created", response=self.resource("in_progress"))
        item = self.item("in_progress")
        await self.send("response.output_item.added", response_id=self.id, output_index=0, item=item)
        if self.in_conversation:
            await self.send("conversation.item.added", previous_item_id=previous_item, item=item)
        empty = {"type": "audio", "transcript": ""} if self.audio else {"type": "text", "text": ""}
        await self.send("response.content_part.added", **self._where(), part=empty)

    async def text_delta(self, delta: str) -> None:
        self.text += delta
        kind = "response.output_audio_transcript.delta" if self.audio else "response.output_text.delta"
        await self.send(kind, **self._where(), delta=delta)

    async def audio_delta(self, pcm16: bytes) -> None:
        if pcm16 and self.audio:
            self.audio_bytes += len(pcm16)
            delta = base64.b64encode(pcm16).decode()
            await self.send("response.output_audio.delta", **self._where(), delta=delta)

    async def end(self, previous_item: str | None, status: str, details: dict | None = None,
                  usage: dict | None = None) -> None:
        where = self._where()
        if self.audio:
            await self.send("response.output_audio.done", **where)
            await self.send("response.output_audio_transcript.done", **where, transcript=self.text)
        else:
            await self.send("response.output_text.done", **where, text=self.text)
        await self.send("response.content_part.done", **where, part=self._part())
        item = self.item(_item_status(status))
        await self.send("response.output_item.done", response_id=self.id, output_index=0, item=item)
        if self.in_conversation:
            await self.send("conversation.item.done", previous_item_id=previous_item, item=item)
        await self.send("response.done", response=self.resource(status, details, usage))

    # -- cancelling -----------------------------------------------------------------------------

    def cancel(self, reason: str) -> None:
        """Stops the response now: its request is aborted in every stage (or, not submitted yet,
        never runs)."""
        if self.cancelled is None:
            self.cancelled = reason
        if self.handle is not None and self.cancel_with is not None:
            self.cancel_with(self.handle)


def _item_status(status: str) -> str:
    """The output item's status once a response with ``status`` has ended."""
    return "completed" if status == "completed" else "incomplete"


def usage_of(payload: dict) -> dict | None:
    """A family's usage (OpenAI's chat or speech names) as a realtime response's usage."""
    usage = payload.get("usage") or {}
    if not usage:
        return None
    inputs = usage.get("input_tokens", usage.get("prompt_tokens", 0))
    outputs = usage.get("output_tokens", usage.get("completion_tokens", 0))
    return {"total_tokens": inputs + outputs, "input_tokens": inputs, "output_tokens": outputs}
