"""A whole benchmark: resolve the model and audio format, warm up, then run each level."""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field
from typing import Protocol

import httpx

from omni_core.bench.dataset import load_items
from omni_core.bench.endpoints import RequestOptions, RequestSender, probe_sample_rate
from omni_core.bench.load import LoadPlan, run_level
from omni_core.bench.records import RequestRecord
from omni_core.bench.summary import LevelSummary, summarize
from omni_core.playback import playback_underrun


class BenchError(RuntimeError):
    """The benchmark cannot start (server unreachable, no model, bad dataset...)."""


@dataclass
class BenchConfig:
    base_url: str
    endpoint: str = "speech"
    concurrencies: tuple[int, ...] = (1,)
    num_requests: int = 16
    stream: bool = True
    stream_format: str = "audio"
    dataset: str | None = None
    request_rate: float | None = None
    seed: int = 0
    model: str | None = None
    voice: str | None = None
    sample_rate: int | None = None
    chat_audio: bool = False
    warmup: int = 1
    detailed: bool = False  # add every request's own numbers to the report
    timeout_s: float = 300.0
    api_key: str | None = field(default=None, repr=False)
    extra_body: dict = field(default_factory=dict)

    def public(self) -> dict:
        """The settings for the JSON report; the key stays out of it."""
        settings = asdict(self)
        settings.pop("api_key")
        settings["concurrencies"] = list(self.concurrencies)
        return settings


class Reporter(Protocol):
    def level_started(self, plan: LoadPlan) -> None: ...
    def request_done(self, record: RequestRecord) -> None: ...
    def level_finished(self, summary: LevelSummary) -> None: ...


def run_benchmark(config: BenchConfig, reporter: Reporter | None = None) -> dict:
    return asyncio.run(_run(config, reporter))


async def _run(config: BenchConfig, reporter: Reporter | None) -> dict:
    if not config.concurrencies or min(config.concurrencies) < 1:
        raise BenchError(f"concurrency levels must be positive integers, got {list(config.concurrencies)}")
    if config.num_requests < 1:
        raise BenchError("--num-requests must be at least 1")
    items = load_items(config.endpoint, config.dataset)
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    timeout = httpx.Timeout(config.timeout_s, connect=10.0)
    async with httpx.AsyncClient(base_url=config.base_url, headers=headers, timeout=timeout) as client:
        model = config.model or await _first_model(client)
        voice = config.voice
        speaks = config.endpoint == "speech" or config.chat_audio
        if speaks and voice is None and not all(item.reference_audio for item in items):
            voice = await _first_voice(client)
        options = RequestOptions(
            endpoint=config.endpoint, model=model, stream=config.stream, stream_format=config.stream_format,
            voice=voice, sample_rate=config.sample_rate, chat_audio=config.chat_audio,
            extra_body=config.extra_body,
        )
        sender = RequestSender(options)
        warmup_sent = 0
        needs_rate = config.stream and speaks
        if needs_rate and options.sample_rate is None:
            try:
                options.sample_rate = await probe_sample_rate(client, sender, items[0])
            except (httpx.HTTPError, ValueError) as exc:
                raise BenchError(f"the request that learns the server's sample rate (a whole wav) failed: "
                                 f"{exc}; fix the request, or pass --sample-rate to skip it") from exc
            warmup_sent += 1
        for index in range(max(config.warmup - warmup_sent, 0)):
            warm = await sender.send(client, items[index % len(items)])
            warmup_sent += 1
            if not warm.ok:
                raise BenchError(f"the warm-up request failed: {warm.detail or warm.error_key}")

    levels = []
    for concurrency in config.concurrencies:
        plan = LoadPlan(concurrency, config.num_requests, config.request_rate, config.seed)
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=config.base_url, headers=headers, timeout=timeout,
                                     limits=limits) as client:
            if reporter:
                reporter.level_started(plan)
            records, duration = await run_level(client, sender, items, plan,
                                                reporter.request_done if reporter else None)
        summary = summarize(records, concurrency=concurrency, request_rate=config.request_rate,
                            duration_s=duration)
        if reporter:
            reporter.level_finished(summary)
        level = summary.to_json()
        if config.detailed:
            first_start = min((r.start for r in records), default=0.0)
            level["requests"] = [request_row(r, first_start) for r in records]
        levels.append(level)
    return {
        "config": config.public(),
        "model": model,
        "voice": voice,
        "sample_rate": options.sample_rate,
        "warmup_requests": warmup_sent,
        "levels": levels,
    }


async def _first_model(client: httpx.AsyncClient) -> str:
    try:
        response = await client.get("/v1/models")
        if response.status_code == 401:
            raise BenchError(f"{str(client.base_url).rstrip('/')} wants an API key: pass --api-key or set OMNI_API_KEY")
        response.raise_for_status()
        return response.json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
        raise BenchError(f"could not read the served model from {str(client.base_url).rstrip('/')}/v1/models ({exc!r}); "
                         "is the server up? pass --model to name it") from exc


async def _first_voice(client: httpx.AsyncClient) -> str | None:
    """The first voice omni's ``GET /v1/audio/voices`` lists; None where a server has no such list
    (then no voice is sent and the server picks its default, or says which one it needs)."""
    try:
        response = await client.get("/v1/audio/voices")
        if response.is_success:
            voices = response.json().get("data") or []
            return str(voices[0]["id"]) if voices else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def request_row(record: RequestRecord, level_start: float) -> dict:
    """One request's own numbers, for plotting or for finding the slow ones."""
    ttfo, latency = record.time_to_first_output, record.latency
    return {
        "sent_at_s": record.start - level_start,
        "status": record.status,
        "error": record.error,
        "detail": record.detail,
        "time_to_first_output_ms": None if ttfo is None else ttfo * 1000.0,
        "latency_ms": None if latency is None else latency * 1000.0,
        "output_audio_seconds": record.output_audio_seconds,
        "input_audio_seconds": record.input_audio_seconds,
        "audio_chunks": len(record.chunks),
        "underrun_s": playback_underrun(record.chunks) if record.chunks else None,
        "output_tokens": record.output_tokens,
    }
