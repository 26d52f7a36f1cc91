"""What the HTTP layer costs, and what streaming buys: one family, the offline ``Omni`` API and
``omni serve`` side by side in one run.

    python benchmarks/serve_overhead.py [--family cosyvoice3] [--preset tiny] [--requests 8]

For each of N sentences (one request at a time, after a warm-up):
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
import socket
import statistics
import subprocess
import sys
import time

import httpx

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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def offline(family: str, preset: str, sentences: list[str], voice: str | None) -> dict[str, list[float]]:
    from omni_core import Omni

    times: dict[str, list[float]] = {"first": [], "last": [], "whole": [], "samples": []}
    with Omni(family, preset=preset) as omni:
        voice = voice or (omni.builtin_voices()[0].id if omni.builtin_voices() else None)
        omni.speech("Warm up.", voice=voice)
        for text in sentences:
            start = time.perf_counter()
            first = None
            for _chunk in omni.speech(text, voice=voice, seed=SEED, stream=True):
                first = first or time.perf_counter()
            times["first"].append(first - start)
            times["last"].append(time.perf_counter() - start)
            start = time.perf_counter()
            result = omni.speech(text, voice=voice, seed=SEED)
            times["whole"].append(time.perf_counter() - start)
            times["samples"].append(len(result.audio))
    return times


def http(family: str, preset: str, sentences: list[str], voice: str | None) -> dict[str, list[float]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "omni_core.cli", "serve", "--family", family, "--preset", preset, "--port", str(port),
         "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    times: dict[str, list[float]] = {"first": [], "last": [], "whole": [], "samples": []}
    try:
        with httpx.Client(timeout=300) as client:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                try:
                    if client.get(f"{url}/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            voices = client.get(f"{url}/v1/audio/voices").json()["data"]
            voice = voice or (voices[0]["id"] if voices else None)
            body = {"model": family, "voice": voice, "seed": SEED}
            client.post(f"{url}/v1/audio/speech", json={**body, "input": "Warm up."}).raise_for_status()
            for text in sentences:
                start = time.perf_counter()
                first = None
                payload = {**body, "input": text, "response_format": "pcm", "stream_format": "audio"}
                with client.stream("POST", f"{url}/v1/audio/speech", json=payload) as r:
                    r.raise_for_status()
                    for chunk in r.iter_bytes():
                        if chunk and first is None:
                            first = time.perf_counter()
                times["first"].append(first - start)
                times["last"].append(time.perf_counter() - start)
                start = time.perf_counter()
                whole = client.post(f"{url}/v1/audio/speech", json={**body, "input": text, "response_format": "pcm"})
                whole.raise_for_status()
                times["whole"].append(time.perf_counter() - start)
                times["samples"].append(len(whole.content) // 2)
    finally:
        server.terminate()
        server.wait(timeout=60)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="cosyvoice3")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--voice", default=None)
    parser.add_argument("--requests", type=int, default=8)
    args = parser.parse_args()
    sentences = (SENTENCES * (args.requests // len(SENTENCES) + 1))[: args.requests]
    off = offline(args.family, args.preset, sentences, args.voice)
    net = http(args.family, args.preset, sentences, args.voice)
    med = {side: {k: statistics.median(v) * 1000 for k, v in times.items() if k != "samples"}
           for side, times in (("offline", off), ("http", net))}
    print(f"{args.family} --preset {args.preset}, {args.requests} requests one at a time; "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch threads default")
    print("| median ms | offline Omni | omni serve (HTTP) | http / offline |")
    print("| --- | --- | --- | --- |")
    labels = {"first": "first audio (streamed)", "last": "last audio (streamed)", "whole": "whole audio (not streamed)"}
    for key, label in labels.items():
        print(f"| {label} | {med['offline'][key]:.0f} | {med['http'][key]:.0f} | {med['http'][key] / med['offline'][key]:.2f} |")
    print(f"audio samples in total: offline {sum(off['samples'])}, http {sum(net['samples'])}")
    for side in ("offline", "http"):
        print(f"{side}: first audio / whole audio = {med[side]['first'] / med[side]['whole']:.2f}")


if __name__ == "__main__":
    main()
