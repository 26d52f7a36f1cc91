"""/v1/realtime speech sessions (OpenAI Realtime API), for any family that speaks and does not
chat: text in, speech out.

The client adds text as user messages (``conversation.item.create`` with ``input_text`` parts)
and asks for a response (``response.create``): the text of the messages added since the last
response (or the response's own ``input`` items) is spoken in the session's voice through the
family's speech path (``Omni.speech_inputs`` and ``Omni.submit``, as POST /v1/audio/speech), its
audio streamed back as ``response.output_audio.delta`` events, the text itself as the audio's
transcript.
"""

from __future__ import annotations

from omni_core.serve.errors import APIError
from omni_core.serve.realtime.conversation_items import Item, read_item
from omni_core.serve.realtime.responding import RespondingSession
from omni_core.serve.realtime.responses import Response
from omni_core.serve.realtime.session_config import refuse


class SpeechSession(RespondingSession):
    kind = "speech"

    def __init__(self, socket, config):
        super().__init__(socket, config)
        self.unspoken: list[str] = []  # the text of user messages since the last response

    def handlers(self) -> dict:
        return {**super().handlers(), "conversation.item.create": self._item_create}

    def _text_of(self, event_item, param: str) -> tuple[Item, str]:
        limits = self.state.config.limits
        item = read_item(event_item, param, self.config.rate, limits, limits.max_input_chars)
        if any(part["type"] != "text" for part in item.parts):
            param = f"{param}.content"
            raise refuse(f"{param}: a speech session speaks text: send input_text parts", param)
        return item, item.text

    async def _item_create(self, event: dict) -> None:
        if event.get("previous_item_id") not in (None, self.previous_item):
            raise refuse("a speech session adds items at the end: previous_item_id must be the last item "
                         "or left out", "previous_item_id")
        item, text = self._text_of(event.get("item"), "item")
        if item.role == "user" and text.strip():
            self._check_length(_spoken([*self.unspoken, text]), "item",
                               ": have what was added spoken (response.create) first")
            self.unspoken.append(text)
        described = item.describe()
        await self.send("conversation.item.added", previous_item_id=self.previous_item, item=described)
        await self.send("conversation.item.done", previous_item_id=self.previous_item, item=described)
        self.previous_item = item.id

    def plan(self, response: Response, params: dict) -> str:
        if response.voice is None:
            raise APIError(400, "a speech session needs a voice: set session.audio.output.voice",
                           param="session.audio.output.voice", code="missing_required_parameter")
        if params.get("input") is not None:
            if not isinstance(params["input"], list):
                raise refuse("response.input must be a list of items", "response.input")
            texts = [self._text_of(item, f"response.input[{i}]")[1] for i, item in enumerate(params["input"])]
        else:
            texts = self.unspoken
        text = _spoken(texts)
        if not text:
            raise APIError(
                400,
                "nothing to speak: add a user message with input_text (conversation.item.create) first",
                param="response.input",
                code="empty_input",
            )
        self._check_length(text, "response.input")
        if params.get("input") is None:
            self.unspoken = []  # a refused response.create keeps them
        return text

    def _check_length(self, text: str, param: str, hint: str = "") -> None:
        limit = self.state.config.limits.max_input_chars
        if len(text) > limit:
            raise APIError(413, f"{len(text)} characters to speak; the limit is {limit}{hint}",
                           param=param, code="too_large")

    async def started(self, response: Response, text: str) -> None:
        await response.text_delta(text)  # what is spoken is the audio's transcript

    def inputs(self, omni, response: Response, text: str) -> dict:
        return omni.speech_inputs(
            text, response.voice, instructions=response.instructions, speed=self.config.speed
        )


def _spoken(texts: list[str]) -> str:
    """What a response speaks of the messages' ``texts``."""
    return " ".join(t.strip() for t in texts if t.strip())
