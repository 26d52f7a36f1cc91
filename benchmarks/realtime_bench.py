"""Latency of the two WebSocket endpoints at several numbers of concurrent sessions.

- transcription: ``/v1/realtime`` transcription sessions with server VAD. Each session streams
  espeak-ng sentences (the built-in prompts, their trailing silence cut) as a microphone would:
  pcm16 at 16 kHz in 100 ms chunks at real time, each sentence followed by ``--pause`` seconds
  of silence. Measured per
  turn: from the moment the chunk holding the end of the sentence's clip was sent to the
  ``conversation.item.input_audio_transcription.completed`` event (end of speech to final
  transcript; it includes server VAD's ``silence_duration_ms`` wait), split at
  ``input_audio_buffer.speech_stopped``.
- speech: ``/v1/audio/speech/stream``. Each socket sends its text word by word, ``--word-ms``
  apart, as an LLM writes it. Measured per socket: from sending the word that completes the
  first sentence to the first binary frame of audio (first audio after the first sentence).

Sessions of a level start spread over the first second, as users do not arrive in lockstep.

    python benchmarks/realtime_bench.py --concurrency 1,16 --json realtime.json
    python benchmarks/realtime_bench.py --only speech --speech-serve "--family cosyvoice3 --preset tiny"
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr
from websockets.asyncio.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parent))
from omni_core.bench.dataset import BUILTIN_TEXTS, spoken  # noqa: E402
from serve_bench import start_server, stop_server  # noqa: E402

RATE = 16000
CHUNK_S = 0.1
SPEECH_TEXTS = (
    "Hello there, this is the first sentence of the reply. Then a second one follows it, a little longer. "
    "And a short third."
)


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]  # noqa: E731
    return {"n": len(values), "p50": pick(0.5), "p90": pick(0.9), "max": ordered[-1],
            "mean": statistics.fmean(values)}


# -- transcription sessions ---------------------------------------------------------------------


def clips(count: int, folder: Path) -> list[np.ndarray]:
    """The first ``count`` built-in sentences spoken by espeak-ng, as 16 kHz float32."""
    out = []
    for text in BUILTIN_TEXTS[:count]:
        samples, rate = sf.read(spoken(text, folder), dtype="float32")
        samples = soxr.resample(samples, rate, RATE).astype(np.float32)
        voiced = np.flatnonzero(np.abs(samples) > 0.01)
        out.append(samples[: voiced[-1] + 1])  # the clip ends where the speech does: no trailing silence
    return out


async def transcription_session(url: str, sentences: list[np.ndarray], pause_s: float, delay_s: float,
                                silence_ms: int) -> list[dict]:
    await asyncio.sleep(delay_s)
    silence = np.zeros(int(pause_s * RATE), np.float32)
    audio, ends = [np.zeros(int(0.5 * RATE), np.float32)], []
    for clip in sentences:
        audio.append(clip)
        ends.append(sum(len(a) for a in audio))  # the sample where the clip ends
        audio.append(silence)
    stream = (np.clip(np.concatenate(audio), -1, 1) * 32767).astype("<i2")
    step = int(RATE * CHUNK_S)
    end_sent: list[float] = []
    stopped: list[float] = []
    completed: list[float] = []
    async with connect(f"{url}/v1/realtime", max_size=2**24, open_timeout=120) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        audio_input = {
            "format": {"type": "audio/pcm", "rate": RATE},
            "transcription": {"language": "en"},
            "turn_detection": {"type": "server_vad", "silence_duration_ms": silence_ms},
        }
        session = {"type": "transcription", "audio": {"input": audio_input}}
        await ws.send(json.dumps({"type": "session.update", "session": session}))
        assert json.loads(await ws.recv())["type"] == "session.updated"

        async def send():
            start = time.monotonic()
            for n, offset in enumerate(range(0, len(stream), step)):
                await asyncio.sleep(max(0.0, start + n * CHUNK_S - time.monotonic()))
                chunk = stream[offset : offset + step].tobytes()
                await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": base64.b64encode(chunk).decode()}))
                while len(end_sent) < len(ends) and offset + step >= ends[len(end_sent)]:
                    end_sent.append(time.monotonic())

        sender = asyncio.ensure_future(send())
        while len(completed) < len(sentences):
            event = json.loads(await asyncio.wait_for(ws.recv(), 120))
            if event["type"] == "input_audio_buffer.speech_stopped":
                stopped.append(time.monotonic())
            elif event["type"] == "conversation.item.input_audio_transcription.completed":
                completed.append(time.monotonic())
            elif event["type"] == "error":
                raise RuntimeError(event["error"])
        await sender
    if len(stopped) != len(sentences):
        raise RuntimeError(f"server VAD found {len(stopped)} turns in {len(sentences)} sentences")
    return [{"end_to_transcript": c - e, "end_to_stopped": s - e, "stopped_to_transcript": c - s}
            for e, s, c in zip(end_sent, stopped, completed, strict=True)]


async def transcription_level(url: str, sessions: int, sentences, pause_s: float, silence_ms: int) -> dict:
    runs = await asyncio.gather(*(
        transcription_session(url, sentences, pause_s, i / sessions, silence_ms) for i in range(sessions)
    ))
    turns = [turn for run in runs for turn in run]
    return {key: percentiles([t[key] * 1000 for t in turns])
            for key in ("end_to_transcript", "end_to_stopped", "stopped_to_transcript")}


# -- streamed-text speech -----------------------------------------------------------------------


async def speech_socket(url: str, model: str, voice: str, word_s: float, delay_s: float) -> dict:
    await asyncio.sleep(delay_s)
    words = [word + " " for word in SPEECH_TEXTS.split()]
    first_end = next(i for i, word in enumerate(words) if word.rstrip().endswith("."))
    sentence_sent = first_audio = None
    async with connect(f"{url}/v1/audio/speech/stream", max_size=2**24, open_timeout=120) as ws:
        await ws.send(json.dumps({"type": "config", "model": model, "voice": voice, "seed": 0}))
        ready = json.loads(await ws.recv())
        if ready["type"] != "ready":
            raise RuntimeError(ready)

        async def write():
            nonlocal sentence_sent
            for index, word in enumerate(words):
                await ws.send(json.dumps({"type": "text", "text": word}))
                if index == first_end:
                    sentence_sent = time.monotonic()
                await asyncio.sleep(word_s)
            await ws.send(json.dumps({"type": "end"}))

        writer = asyncio.ensure_future(write())
        while True:
            message = await asyncio.wait_for(ws.recv(), 300)
            if isinstance(message, bytes):
                first_audio = first_audio or time.monotonic()
                continue
            event = json.loads(message)
            if event["type"] == "done":
                break
            if event["type"] == "error":
                raise RuntimeError(event["error"])
        await writer
    return {"first_audio_after_sentence": first_audio - sentence_sent}


async def speech_level(url: str, sockets: int, model: str, voice: str, word_s: float, rounds: int) -> dict:
    results = []
    for _ in range(rounds):
        results += await asyncio.gather(*(
            speech_socket(url, model, voice, word_s, i / sockets) for i in range(sockets)
        ))
    waits = [r["first_audio_after_sentence"] * 1000 for r in results]
    return {"first_audio_after_sentence": percentiles(waits)}


# -- the run --------------------------------------------------------------------------------------


def served_model(url: str) -> str:
    import httpx

    return httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]


def voice_of(url: str) -> str:
    import httpx

    return httpx.get(f"{url}/v1/audio/voices", timeout=30).json()["data"][0]["id"]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", default="1,16", help="sessions at once, comma list")
    parser.add_argument("--only", choices=("transcription", "speech"))
    parser.add_argument("--transcription-serve", default="--family whisper --max-running 32")
    parser.add_argument("--speech-serve", default="--family cosyvoice3 --preset tiny --max-running 32")
    parser.add_argument("--sentences", type=int, default=3, help="sentences a transcription session speaks")
    parser.add_argument("--pause", type=float, default=1.5, help="seconds of silence after each sentence")
    parser.add_argument("--silence-ms", type=int, default=500, help="server VAD's silence_duration_ms")
    parser.add_argument("--word-ms", type=float, default=50, help="time between words on the speech socket")
    parser.add_argument(
        "--speech-sockets", type=int, default=16, help="speech sockets measured a level (at least)"
    )
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--log", default="realtime-serve.log")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    results: dict = {"concurrency": levels}
    with open(args.log, "w") as log:
        if args.only in (None, "transcription"):
            sentences = clips(args.sentences, Path(tempfile.gettempdir()) / "omni-bench-audio")
            server, url = start_server(args.transcription_serve.split(), log)
            try:
                ws_url = url.replace("http://", "ws://")
                warm_up = transcription_level(ws_url, 1, sentences[:1], args.pause, args.silence_ms)
                asyncio.run(warm_up)
                results["transcription"] = {
                    c: asyncio.run(transcription_level(ws_url, c, sentences, args.pause, args.silence_ms))
                    for c in levels
                }
                print(json.dumps(results["transcription"], indent=1), flush=True)
            finally:
                stop_server(server)
        if args.only in (None, "speech"):
            server, url = start_server(args.speech_serve.split(), log)
            try:
                model, voice, ws_url = served_model(url), voice_of(url), url.replace("http://", "ws://")
                word_s = args.word_ms / 1000
                asyncio.run(speech_level(ws_url, 1, model, voice, word_s, 1))  # warm-up
                results["speech"] = {
                    c: asyncio.run(
                        speech_level(ws_url, c, model, voice, word_s, -(-args.speech_sockets // c))
                    )
                    for c in levels
                }
                print(json.dumps(results["speech"], indent=1), flush=True)
            finally:
                stop_server(server)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
