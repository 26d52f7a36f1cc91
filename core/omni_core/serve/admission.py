"""Admission control: at most ``max_running`` requests run, ``max_queued`` more wait, the rest
get 429 with Retry-After. Draining refuses new work with 503 and lets admitted requests finish.

A request holds its slot until its response is fully sent (streams included), so the limits
bound the work the pipeline sees.
"""

from __future__ import annotations

import asyncio
import math

from omni_core.serve.errors import APIError


class Admission:
    def __init__(self, max_running: int, max_queued: int):
        if max_running < 1 or max_queued < 0:
            raise ValueError("max_running must be >= 1 and max_queued >= 0")
        self.max_running = max_running
        self.max_queued = max_queued
        self.running = 0
        self.queued = 0
        self.draining = False
        self._wakeup: asyncio.Condition | None = None
        self._recent_seconds = 1.0  # smoothed request duration, for Retry-After

    def _condition(self) -> asyncio.Condition:
        if self._wakeup is None:
            self._wakeup = asyncio.Condition()
        return self._wakeup

    def retry_after(self) -> int:
        waiting_rounds = (self.queued + self.running) / self.max_running
        return max(1, math.ceil(waiting_rounds * self._recent_seconds))

    async def acquire(self) -> None:
        """Take a running slot, waiting in the queue if needed; raises 429 or 503."""
        if self.draining:
            raise draining_error()
        if self.running < self.max_running and self.queued == 0:
            self.running += 1
            return
        if self.queued >= self.max_queued:
            raise APIError(
                429,
                f"server busy: {self.running} requests running and {self.queued} queued; retry later",
                type="rate_limit_error",
                code="server_busy",
                headers={"Retry-After": str(self.retry_after())},
            )
        cond = self._condition()
        self.queued += 1
        try:
            async with cond:
                await cond.wait_for(lambda: self.draining or self.running < self.max_running)
        finally:
            self.queued -= 1
        if self.draining:
            raise draining_error()
        self.running += 1

    async def release(self, seconds: float | None = None) -> None:
        self.running -= 1
        if seconds is not None:
            self._recent_seconds = 0.8 * self._recent_seconds + 0.2 * seconds
        cond = self._condition()
        async with cond:
            cond.notify(1)

    async def wake_one(self) -> None:
        """Wakes a queued request if a slot is free (after a waiter left the queue: the wake-up
        it was given, if any, must not be lost)."""
        if self.running < self.max_running:
            cond = self._condition()
            async with cond:
                cond.notify(1)

    async def start_draining(self) -> None:
        self.draining = True
        cond = self._condition()
        async with cond:
            cond.notify_all()


def draining_error() -> APIError:
    return APIError(
        503, "the server is shutting down", type="server_error", code="draining", headers={"Retry-After": "5"}
    )
