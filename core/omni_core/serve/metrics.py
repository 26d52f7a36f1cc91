"""Prometheus metrics of one server: request counts and latencies per endpoint, time to first
audio, real-time factor, streamed audio's playback margin (as a real-time listener of what the
server sent would hear it: the least buffered audio and the gaps), admission gauges and the pipeline's per-stage gauges (KV-cache use of
AR stages) read at scrape time.

Requests are counted when their response starts, so a client that has its status line is
already counted when it next scrapes /metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# seconds of audio a streamed reply's listener had left at the worst moment (negative: a gap)
BUFFER_BUCKETS = (-2, -1, -0.5, -0.1, 0, 0.1, 0.25, 0.5, 1, 2, 5, 10)
RTF_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 5, 10)
ENDPOINTS = (
    "/v1/audio/speech",
    "/v1/audio/transcriptions",
    "/v1/audio/translations",
    "/v1/chat/completions",
    "/v1/audio/voices",
    "/v1/models",
    "/health",
    "/metrics",
)


def endpoint_label(path: str) -> str:
    if path.startswith("/v1/audio/voices/"):
        return "/v1/audio/voices/{id}"
    return path if path in ENDPOINTS else "other"


class _StageCollector:
    """Per-stage gauges from ``stats()`` of the runtime, collected when scraped."""

    def __init__(self, stats: Callable[[], dict]):
        self.stats = stats

    def collect(self):
        kv = GaugeMetricFamily(
            "omni_kv_cache_usage", "Fraction of KV-cache blocks in use, per AR stage", labels=["stage"]
        )
        queue = GaugeMetricFamily("omni_stage_queue_depth", "Messages waiting in a stage", labels=["stage"])
        running = GaugeMetricFamily(
            "omni_stage_requests", "Requests holding state in a stage", labels=["stage"]
        )
        restarts = CounterMetricFamily(
            "omni_stage_restarts", "Times a stage's process died and was restarted", labels=["stage"]
        )
        try:
            stats = self.stats() or {}
        except Exception:
            stats = {}
        for stage, values in (stats.get("stages") or {}).items():
            if "kv_usage" in values:
                kv.add_metric([stage], float(values["kv_usage"]))
            # batch stages count queued messages, AR stages waiting sequences
            queue.add_metric([stage], float(values.get("queue_depth", 0)) + float(values.get("waiting", 0)))
            if "running" in values:
                running.add_metric([stage], float(values["running"]))
            if "restarts" in values:  # stages placed in processes
                restarts.add_metric([stage], float(values["restarts"]))
        yield kv
        yield queue
        yield running
        yield restarts


class ServerMetrics:
    def __init__(self, admission, runtime_stats: Callable[[], dict]):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "omni_requests", "HTTP requests by endpoint and status", ["endpoint", "status"], registry=r
        )
        self.latency = Histogram(
            "omni_request_duration_seconds",
            "Time from request to last byte",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.first_audio = Histogram(
            "omni_time_to_first_audio_seconds",
            "Time from request to the first audio bytes sent",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.rtf = Histogram(
            "omni_real_time_factor",
            "Processing time divided by audio duration",
            ["endpoint"],
            buckets=RTF_BUCKETS,
            registry=r,
        )
        self.least_buffer = Histogram(
            "omni_stream_least_buffer_seconds",
            "Least audio a real-time listener of a streamed reply had buffered when more arrived "
            "(negative: it waited that long)",
            ["endpoint"],
            buckets=BUFFER_BUCKETS,
            registry=r,
        )
        self.underrun = Counter(
            "omni_stream_underrun_seconds",
            "Seconds real-time listeners of streamed replies waited for audio once playback started",
            ["endpoint"],
            registry=r,
        )
        self.audio_seconds = Counter(
            "omni_audio_seconds", "Seconds of audio produced or consumed", ["endpoint"], registry=r
        )
        self.aborted = Counter(
            "omni_requests_aborted", "Requests aborted (client gone or shutdown)", ["endpoint"], registry=r
        )
        self.timed_out = Counter(
            "omni_requests_timed_out",
            "Requests stopped by their deadline (--request-timeout, X-Request-Timeout)",
            ["endpoint"],
            registry=r,
        )
        Gauge("omni_running_requests", "Requests admitted and running", registry=r).set_function(
            lambda: admission.running
        )
        Gauge("omni_queue_depth", "Requests waiting for a running slot", registry=r).set_function(
            lambda: admission.queued
        )
        r.register(_StageCollector(runtime_stats))

    def observe_playback(self, endpoint: str, buffer) -> None:
        """A streamed reply's ``PlaybackBuffer`` at its end (as the server sent the audio)."""
        if buffer.lowest is not None:
            self.least_buffer.labels(endpoint).observe(buffer.lowest)
        self.underrun.labels(endpoint).inc(buffer.stalled)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsMiddleware:
    """Pure ASGI, so streamed bodies pass through untouched."""

    def __init__(self, app, metrics_getter: Callable[[], ServerMetrics | None]):
        self.app = app
        self.metrics_getter = metrics_getter

    async def __call__(self, scope, receive, send):
        metrics = self.metrics_getter() if scope["type"] == "http" else None
        if metrics is None:
            return await self.app(scope, receive, send)
        endpoint = endpoint_label(scope["path"])
        started = time.perf_counter()
        counted = False

        async def counting_send(message):
            nonlocal counted
            if message["type"] == "http.response.start" and not counted:
                counted = True
                metrics.requests.labels(endpoint, str(message["status"])).inc()
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            if not counted:  # the app died before answering: uvicorn sends a 500
                metrics.requests.labels(endpoint, "500").inc()
            metrics.latency.labels(endpoint).observe(time.perf_counter() - started)
