"""Load generation: a closed loop (N clients back to back) or an open loop (Poisson arrivals).

Both are seeded, so two runs, or two servers, see the same requests in the same order at the
same offsets.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

from omni_core.bench.dataset import BenchItem
from omni_core.bench.endpoints import RequestSender
from omni_core.bench.records import RequestRecord


@dataclass(frozen=True)
class LoadPlan:
    concurrency: int  # most requests in flight at once
    num_requests: int
    request_rate: float | None = None  # requests per second (open loop); None: closed loop
    seed: int = 0


def request_order(items: Sequence[BenchItem], num_requests: int, seed: int) -> list[BenchItem]:
    """``num_requests`` items: the dataset shuffled with ``seed``, repeated as often as needed."""
    if not items:
        raise ValueError("no benchmark items")
    rng = random.Random(seed)
    order: list[BenchItem] = []
    while len(order) < num_requests:
        batch = list(items)
        rng.shuffle(batch)
        order.extend(batch)
    return order[:num_requests]


def arrival_offsets(num_requests: int, request_rate: float | None, seed: int) -> list[float]:
    """Seconds after the start at which each request is sent: all at 0 for a closed loop, else a
    Poisson process (exponential gaps of mean ``1 / request_rate``) starting with one at 0."""
    if request_rate is None:
        return [0.0] * num_requests
    if request_rate <= 0:
        raise ValueError(f"request rate must be positive, got {request_rate}")
    rng = random.Random(seed)
    offsets, now = [], 0.0
    for index in range(num_requests):
        if index:
            now += rng.expovariate(request_rate)
        offsets.append(now)
    return offsets


async def run_level(
    client: httpx.AsyncClient,
    sender: RequestSender,
    items: Sequence[BenchItem],
    plan: LoadPlan,
    on_done: Callable[[RequestRecord], None] | None = None,
) -> tuple[list[RequestRecord], float]:
    """Runs one level; returns the records in request order and the wall time it took."""
    order = request_order(items, plan.num_requests, plan.seed)
    records: list[RequestRecord | None] = [None] * len(order)

    async def one(index: int) -> None:
        record = await sender.send(client, order[index])
        records[index] = record
        if on_done is not None:
            on_done(record)

    started = time.perf_counter()
    if plan.request_rate is None:
        next_index = iter(range(len(order)))

        async def client_loop() -> None:
            for index in next_index:  # a shared iterator: each index goes to exactly one loop
                await one(index)

        await asyncio.gather(*(client_loop() for _ in range(min(plan.concurrency, len(order)))))
    else:
        slots = asyncio.Semaphore(plan.concurrency)

        async def limited(index: int) -> None:
            try:
                await one(index)
            finally:
                slots.release()

        tasks = []
        for index, offset in enumerate(arrival_offsets(len(order), plan.request_rate, plan.seed)):
            delay = started + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await slots.acquire()
            tasks.append(asyncio.create_task(limited(index)))
        await asyncio.gather(*tasks)
    return [r for r in records if r is not None], time.perf_counter() - started
