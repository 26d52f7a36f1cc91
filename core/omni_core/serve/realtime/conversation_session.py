"""/v1/realtime conversation sessions (OpenAI Realtime API), for any family that chats: audio and
text in, text and audio out, turn by turn, with the conversation kept for the session.

User turns come as audio (``AudioInput``: the buffer, server VAD or commits by hand) or as items
(``conversation.item.create``); a response answers the whole conversation so far, through the
family's chat path (``Omni.chat_inputs`` and ``Omni.submit``, as POST /v1/chat/completions), and
joins it (its text, or its audio's transcript: what the family reads back next turn). With server
VAD, a turn that ends asks for a response (``create_response``) and speech that starts while one
is being made cancels it (``interrupt_response``: barge-in), as ``response.cancel`` does; a
cancelled response's request is aborted in every stage at once, and what it said so far stays in
the conversation.
"""

from __future__ import annotations

import numpy as np

from omni_core.serve.realtime.audio_input import AudioInput
from omni_core.serve.realtime.conversation_items import Item, audio_part, read_item
from omni_core.serve.realtime.responding import RespondingSession
from omni_core.serve.realtime.responses import CANCELLED_BY_TURN, Response
from omni_core.serve.realtime.session_config import refuse
from omni_core.surface.inputs import chat_text_chars

ROOT = "root"  # OpenAI's previous_item_id for "at the start"
# What the conversation keeps (older items are forgotten, oldest first, as OpenAI's truncation
# drops them): spoken turns are the costly part of a prompt, and families bound the audio parts
# a request may hold; a text conversation is bounded by its number of items and by the text a
# chat request may hold (``chat_text_chars``, the instructions included).
KEPT_AUDIO_TURNS = 4
KEPT_ITEMS = 256


class ConversationSession(RespondingSession):
    kind = "conversation"

    def __init__(self, socket, config):
        super().__init__(socket, config)
        self.items: list[Item] = []
        self.audio = AudioInput(self, self._turn, self._speech_started)

    def handlers(self) -> dict:
        return {**super().handlers(), **self.audio.handlers(), "conversation.item.create": self._item_create}

    def configured(self, config) -> None:
        super().configured(config)
        self.audio.configure(config)
        self._forget_old(config)

    # -- the conversation ------------------------------------------------------------------------

    def _forget_old(self, config=None) -> None:
        """Keeps the newest items holding at most ``KEPT_AUDIO_TURNS`` spoken parts and, with the
        session's instructions, the text a chat request may hold; the newest is always kept."""
        instructions = (config or self.config).instructions or ""
        room = chat_text_chars(self.state.config.limits) - len(instructions)
        audio_parts, chars, keep = 0, 0, 0
        for item in reversed(self.items[-KEPT_ITEMS:]):
            audio_parts += sum(part["type"] == "audio" for part in item.parts)
            chars += len(item.text)
            if keep and (audio_parts > KEPT_AUDIO_TURNS or chars > room):
                break
            keep += 1
        if keep < len(self.items):
            del self.items[: len(self.items) - keep]

    def _add(self, item: Item, after: str | None) -> str | None:
        """Adds ``item`` after the item ``after`` (None: at the end); the item before it."""
        if any(existing.id == item.id for existing in self.items):
            raise refuse(f"item.id {item.id!r} is in the conversation already", "item.id")
        if after is None:
            position = len(self.items)
        elif after == ROOT:
            position = 0
        else:
            found = [i for i, existing in enumerate(self.items) if existing.id == after]
            if not found:
                raise refuse(f"previous_item_id {after!r} is not in the conversation", "previous_item_id")
            position = found[0] + 1
        self.items.insert(position, item)
        previous = self.items[position - 1].id if position else None
        if position == len(self.items) - 1:
            self.previous_item = item.id
        self._forget_old()
        return previous

    async def _item_create(self, event: dict) -> None:
        after = event.get("previous_item_id")
        if after is not None and not isinstance(after, str):
            raise refuse("previous_item_id must be an item id or \"root\"", "previous_item_id")
        limits = self.state.config.limits
        item = read_item(event.get("item"), "item", self.config.rate, limits, chat_text_chars(limits))
        if sum(part["type"] == "audio" for part in item.parts) > KEPT_AUDIO_TURNS:
            raise refuse(f"item.content: at most {KEPT_AUDIO_TURNS} input_audio parts an item "
                         "(the conversation keeps no more)", "item.content")
        previous = self._add(item, after)
        await self.send("conversation.item.added", previous_item_id=previous, item=item.describe())
        await self.send("conversation.item.done", previous_item_id=previous, item=item.describe())

    async def _turn(self, item_id: str, samples: np.ndarray, by_vad: bool) -> None:
        # AudioInput has announced the item (now the last): it joins the conversation as the user's audio
        described = [{"type": "input_audio", "transcript": None}]
        self.items.append(Item(item_id, "user", [audio_part(samples)], described))
        self._forget_old()
        vad = self.config.turn_detection
        if by_vad and vad is not None and vad.create_response:
            # a turn that ends while a response runs (barge-in off) waits for it
            await self.queue(self._new_response({}), {})

    async def _speech_started(self, item_id: str) -> None:
        vad = self.config.turn_detection
        if vad is not None and vad.interrupt_response:
            self.cancel_responses(CANCELLED_BY_TURN)

    # -- responses -------------------------------------------------------------------------------

    def plan(self, response: Response, params: dict) -> list[Item] | None:
        """The items the response answers: its own ``input``, or None: the conversation as it is
        when the response starts (a reply cut short by barge-in is in it by then)."""
        given = params.get("input")
        if given is None:
            return None
        if not isinstance(given, list):
            raise refuse("response.input must be a list of items", "response.input")
        items = []
        for index, value in enumerate(given):
            where = f"response.input[{index}]"
            if isinstance(value, dict) and value.get("type") == "item_reference":
                found = [item for item in self.items if item.id == value.get("id")]
                if not found:
                    raise refuse(f"{where}.id {value.get('id')!r} is not in the conversation", f"{where}.id")
                items.append(found[0])
            else:
                limits = self.state.config.limits
                items.append(read_item(value, where, self.config.rate, limits, chat_text_chars(limits)))
        return items

    def inputs(self, omni, response: Response, items: list[Item] | None) -> dict:
        items = list(self.items) if items is None else items
        messages = [item.message() for item in items if item.parts]
        instructions = response.instructions
        if instructions:
            messages.insert(0, {"role": "system", "content": instructions})
        sampling = {} if response.max_output_tokens is None else {"max_tokens": response.max_output_tokens}
        modalities = ["text", "audio"] if response.audio else ["text"]
        # the parts are the session's own (samples read from the client's pcm16): local parts
        return omni.chat_inputs(messages, modalities=modalities, voice=response.voice, sampling=sampling)

    def finished(self, response: Response, items: list[Item] | None, status: str) -> None:
        if response.in_conversation and response.text:
            kind = "output_audio" if response.audio else "output_text"
            described = [{"type": kind, ("transcript" if response.audio else "text"): response.text}]
            self.items.append(Item(response.item_id, "assistant", [{"type": "text", "text": response.text}],
                                   described, "completed" if status == "completed" else "incomplete"))
            self._forget_old()
