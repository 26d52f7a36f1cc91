"""What every /v1/realtime session shares: its id, server events with their ids, the
conversation's last item (what the next item follows), ``session.update``, and the loop that
reads client events and hands each to its handler (a message that is not an event, an unknown
type and a refused event each get an ``error`` event; the socket stays open)."""

from __future__ import annotations

from omni_core.serve.errors import APIError
from omni_core.serve.exceptions import InvalidInput
from omni_core.serve.realtime.sockets import Socket, error_event, error_event_of, new_id


class RealtimeSession:
    kind = "realtime"  # the session's type as error messages name it

    def __init__(self, socket: Socket, config):
        self.socket = socket
        self.state = socket.state
        self.config = config
        self.session_id = new_id("sess")
        self.previous_item: str | None = None  # the conversation's last item

    def handlers(self) -> dict:
        """Client event type -> coroutine taking the event."""
        return {"session.update": self._session_update}

    def updated(self, session) -> object:
        """The settings with a ``session.update``'s ``session`` applied (a new object)."""
        raise NotImplementedError

    def configured(self, config) -> None:
        """Takes the settings a ``session.update`` made, before they are the session's (refusing
        them, ``APIError``, leaves every setting as it was)."""

    async def _session_update(self, event: dict) -> None:
        config = self.updated(event.get("session"))
        self.configured(config)
        self.config = config
        await self.send("session.updated", session=config.describe(self.session_id))

    def busy(self) -> bool:
        """Whether work of the session runs (the idle timeout waits for it)."""
        return False

    async def send(self, kind: str, **fields) -> None:
        await self.socket.send({"type": kind, "event_id": new_id("event"), **fields})

    async def receive(self) -> None:
        await self.send("session.created", session=self.config.describe(self.session_id))
        handlers = self.handlers()
        while True:
            event, refused = await self.socket.receive_json(self.busy)
            if refused is not None:
                await self.socket.send(error_event(refused, "invalid_event"))
                continue
            kind = event.get("type")
            client_event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
            handler = handlers.get(kind)
            if handler is None:
                await self.socket.send(
                    error_event(
                        f"unknown or unsupported event type {kind!r} in a {self.kind} session; "
                        f"send one of {', '.join(handlers)}",
                        "unknown_event",
                        param="type",
                        event_id=client_event_id,
                    )
                )
                continue
            try:
                await handler(event)
            except (APIError, InvalidInput) as exc:
                await self.socket.send(error_event_of(exc, client_event_id))
