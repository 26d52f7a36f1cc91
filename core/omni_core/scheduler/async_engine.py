"""Streaming over asyncio: the engine steps in its own thread; each request gets an asyncio queue.

    engine = AsyncAREngine(AREngine.from_pretrained(path))
    async for out in engine.stream(prompt_token_ids=[...], params=SamplingParams(max_tokens=32)):
        print(out.new_token_ids)

Leaving the ``async for`` early (or cancelling the task) aborts the request and frees its blocks.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

from omni_core.scheduler.engine import AREngine, EngineRequest, GenerationOutput, RequestOutput
from omni_core.scheduler.engine_loop import EngineLoop
from omni_core.scheduler.sampling_params import SamplingParams


class RequestFailed(RuntimeError):
    pass


class AsyncAREngine:
    def __init__(self, engine: AREngine):
        self.engine = engine
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self.loop = EngineLoop(engine, self._deliver, self._fail, name="async-ar-engine")
        self.loop.start()

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            entry = self._queues.get(out.request_id)
            if entry is not None:
                entry[0].call_soon_threadsafe(entry[1].put_nowait, out)

    def _fail(self, request_id: str, error: str) -> None:
        entry = self._queues.get(request_id)
        if entry is not None:
            entry[0].call_soon_threadsafe(entry[1].put_nowait, RequestFailed(error))

    async def stream(self, prompt_token_ids: list[int] | None = None, params: SamplingParams | None = None, prompt_embeds: Any = None, request_id: str | None = None, extras: dict | None = None,
                     prefix_key: Any = None) -> AsyncIterator[RequestOutput]:
        """Yields one RequestOutput per step that gave this request a token; the last has ``finished``
        (``extras`` and ``prefix_key`` as in ``EngineRequest``)."""
        request_id = request_id or f"stream-{uuid.uuid4().hex}"
        request = EngineRequest(request_id, prompt_token_ids, prompt_embeds, params or SamplingParams(), extras or {}, prefix_key=prefix_key)
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = (asyncio.get_running_loop(), queue)
        self.loop.add(request_id, lambda: request)
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, Exception):
                    finished = True
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                self.loop.abort(request_id)

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams | None = None) -> GenerationOutput:
        tokens: list[int] = []
        reason = None
        request_id = f"generate-{uuid.uuid4().hex}"
        async for out in self.stream(prompt_token_ids, params, request_id=request_id):
            tokens.extend(out.new_token_ids)
            reason = out.finish_reason
        return GenerationOutput(request_id, tokens, reason)

    def shutdown(self) -> None:
        self.loop.stop()
