"""What the HTTP layer costs, and what streaming buys: one family, the offline ``Omni`` API and
``omni serve`` side by side in one run.

    python benchmarks/serve_overhead.py [--family cosyvoice3] [--preset tiny] [--requests 8]

For each of N sentences (one request at a time, after a warm-up; offline and HTTP interleaved):
- offline: ``Omni.speech(stream=True)`` (time to the first chunk, time to the last) and
  ``Omni.speech()`` (whole audio);
- http: ``omni serve`` on 127.0.0.1 as a subprocess; ``stream_format="audio"`` pcm (time to the
  first body byte, to the last) and a non-streamed wav (whole response).
Every request carries the same seed, so both sides synthesise the same audio (a random-weight
preset otherwise stops at random lengths); the total samples of each side are printed to show it.
Medians are reported with the ratios http/offline (the serving layer's overhead: validation,
encoding, transfer) and first-audio/whole (what streaming saves a listener).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from functools import partial

import httpx
from serve_bench import start_server, stop_server  # beside this script

SEED = 1
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Streaming speech lets a listener start before the sentence is done.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "A short one.",
    "Six spoons of fresh snow peas, five thick slabs of blue cheese, and maybe a snack for her brother Bob.",
    "We also need a small plastic snake and a big toy frog for the kids.",
    "She can scoop these things into three red bags, and we will go meet her Wednesday at the train station.",
    "Numbers like 1234 and dates like March 3rd are spoken too.",
]


def offline_streamed(omni, text: str, voice: str | None) -> tuple[float, float]:
    start = time.perf_counter()
    first = None
    for _chunk in omni.speech(text, voice=voice, seed=SEED, stream=True):
        first = first or time.perf_counter()
    return first - start, time.perf_counter() - start


def offline_whole(omni, text: str, voice: str | None) -> tuple[float, int]:
    start = time.perf_counter()
    result = omni.speech(text, voice=voice, seed=SEED)
    return time.perf_counter() - start, len(result.audio)


def http_streamed(client: httpx.Client, url: str, body: dict) -> tuple[float, float]:
    start = time.perf_counter()
    first = None
    with client.stream(
        "POST", f"{url}/v1/audio/speech", json={**body, "response_format": "pcm", "stream_format": "audio"}
    ) as r:
        r.raise_for_status()
        for chunk in r.iter_bytes():
            if chunk and first is None:
                first = time.perf_counter()
    return first - start, time.perf_counter() - start


def http_whole(client: httpx.Client, url: str, body: dict) -> tuple[float, int]:
    start = time.perf_counter()
    r = client.post(f"{url}/v1/audio/speech", json={**body, "response_format": "pcm"})
    r.raise_for_status()
    return time.perf_counter() - start, len(r.content) // 2


def measure(
    family: str, preset: str, sentences: list[str], voice: str | None
) -> dict[str, dict[str, list[float]]]:
    """Offline and HTTP requests interleaved, so that load drifts hit both sides alike."""
    from omni_core import Omni

    times = {side: {"first": [], "last": [], "whole": [], "samples": []} for side in ("offline", "http")}
    server, url = start_server(["--family", family, "--preset", preset, "--log-level", "warning"], timeout_s=300)
    try:
        with Omni(family, preset=preset) as omni, httpx.Client(timeout=300) as client:
            voice = voice or (omni.builtin_voices()[0].id if omni.builtin_voices() else None)
            omni.speech("Warm up.", voice=voice)
            client.post(
                f"{url}/v1/audio/speech", json={"model": family, "voice": voice, "input": "Warm up."}
            ).raise_for_status()
            for text in sentences:
                body = {"model": family, "voice": voice, "seed": SEED, "input": text}
                for side, streamed, whole in (
                    (
                        "offline",
                        partial(offline_streamed, omni, text, voice),
                        partial(offline_whole, omni, text, voice),
                    ),
                    (
                        "http",
                        partial(http_streamed, client, url, body),
                        partial(http_whole, client, url, body),
                    ),
                ):
                    first, last = streamed()
                    seconds, samples = whole()
                    for key, value in (
                        ("first", first),
                        ("last", last),
                        ("whole", seconds),
                        ("samples", samples),
                    ):
                        times[side][key].append(value)
    finally:
        stop_server(server)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="cosyvoice3")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--voice", default=None)
    parser.add_argument("--requests", type=int, default=8)
    args = parser.parse_args()
    sentences = (SENTENCES * (args.requests // len(SENTENCES) + 1))[: args.requests]
    times = measure(args.family, args.preset, sentences, args.voice)
    off, net = times["offline"], times["http"]
    med = {
        side: {k: statistics.median(v) * 1000 for k, v in times.items() if k != "samples"}
        for side, times in (("offline", off), ("http", net))
    }
    print(
        f"{args.family} --preset {args.preset}, {args.requests} requests one at a time; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch threads default"
    )
    print("| median ms | offline Omni | omni serve (HTTP) | http / offline |")
    print("| --- | --- | --- | --- |")
    labels = {
        "first": "first audio (streamed)",
        "last": "last audio (streamed)",
        "whole": "whole audio (not streamed)",
    }
    for key, label in labels.items():
        print(
            f"| {label} | {med['offline'][key]:.0f} | {med['http'][key]:.0f} | {med['http'][key] / med['offline'][key]:.2f} |"
        )
    print(f"audio samples in total: offline {sum(off['samples'])}, http {sum(net['samples'])}")
    for side in ("offline", "http"):
        print(f"{side}: first audio / whole audio = {med[side]['first'] / med[side]['whole']:.2f}")


if __name__ == "__main__":
    main()
