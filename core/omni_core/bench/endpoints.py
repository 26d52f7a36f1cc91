"""One benchmark request per endpoint, over plain HTTP, timing every piece of output as it lands.

Audio length comes from the bytes themselves: a wav header for whole responses, and for streams
raw 16-bit mono PCM at the server's sample rate (the ``X-Sample-Rate`` response header when the
server sends one, else the rate the benchmark learned from a wav probe, see ``probe_sample_rate``).
"""

from __future__ import annotations

import base64
import io
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import soundfile
from httpx_sse import EventSource, SSEError

from omni_core.bench.dataset import BenchItem
from omni_core.bench.records import RequestRecord

PCM_BYTES_PER_SAMPLE = 2  # 16-bit little-endian mono


@dataclass
class RequestOptions:
    endpoint: str  # speech | transcriptions | chat
    model: str
    stream: bool = True
    stream_format: str = "audio"  # speech streams: "audio" (chunked PCM body) or "sse"
    voice: str | None = None
    sample_rate: int | None = None  # of streamed PCM when the server does not say
    chat_audio: bool = False  # chat asks for ["text", "audio"] modalities
    extra_body: dict = field(default_factory=dict)  # merged into JSON bodies (sampling, seed...)


class RequestSender:
    """Sends one item as one request and records what came back, never raising for a failure."""

    def __init__(self, options: RequestOptions):
        self.options = options
        self._audio_cache: dict[Path, tuple[bytes, float]] = {}

    def audio_file(self, path: Path) -> tuple[bytes, float]:
        """The file's bytes and its length in seconds, read once per run."""
        if path not in self._audio_cache:
            self._audio_cache[path] = (path.read_bytes(), soundfile.info(str(path)).duration)
        return self._audio_cache[path]

    async def send(self, client: httpx.AsyncClient, item: BenchItem) -> RequestRecord:
        record = RequestRecord(start=time.perf_counter())
        try:
            if self.options.endpoint == "speech":
                await self._speech(client, item, record)
            elif self.options.endpoint == "transcriptions":
                await self._transcription(client, item, record)
            else:
                await self._chat(client, item, record)
            if record.end is None:
                record.end = time.perf_counter()
        except httpx.TimeoutException as exc:
            record.fail("timeout", repr(exc), time.perf_counter())
        except httpx.HTTPError as exc:  # refused, reset, or a body cut short
            record.fail("connect" if isinstance(exc, httpx.ConnectError) else "protocol", repr(exc),
                        time.perf_counter())
        except (SSEError, ValueError, KeyError, TypeError, soundfile.LibsndfileError) as exc:
            # The server answered 200 with something that is not what the endpoint promises.
            record.fail("protocol", repr(exc), time.perf_counter())
        return record

    # -- speech -------------------------------------------------------------------------------

    def speech_body(self, item: BenchItem, response_format: str, stream: bool) -> dict:
        body = {"model": self.options.model, "input": item.text, "response_format": response_format}
        if self.options.voice:
            body["voice"] = self.options.voice
        if item.reference_audio is not None:
            data, _ = self.audio_file(item.reference_audio)
            body["reference_audio"] = base64.b64encode(data).decode()
            body["reference_text"] = item.reference_text
        if stream:
            body["stream_format"] = self.options.stream_format
        return {**body, **self.options.extra_body}

    async def _speech(self, client: httpx.AsyncClient, item: BenchItem, record: RequestRecord) -> None:
        stream = self.options.stream
        body = self.speech_body(item, "pcm" if stream else "wav", stream)
        async with client.stream("POST", "/v1/audio/speech", json=body) as response:
            if not await _accepted(response, record):
                return
            if not stream:
                await _read_wav(response, record)
            elif self.options.stream_format == "sse":
                await self._read_speech_sse(response, record)
            else:
                await self._read_pcm(response, record)

    async def _read_pcm(self, response: httpx.Response, record: RequestRecord) -> None:
        rate = self._stream_rate(response)
        leftover = 0  # a sample may be split across two network reads
        async for piece in response.aiter_bytes():
            now = time.perf_counter()
            usable = (leftover + len(piece)) // PCM_BYTES_PER_SAMPLE
            leftover = (leftover + len(piece)) % PCM_BYTES_PER_SAMPLE
            record.add_audio(now, usable / rate)

    async def _read_speech_sse(self, response: httpx.Response, record: RequestRecord) -> None:
        rate = self._stream_rate(response)
        async for event in EventSource(response).aiter_sse():
            now = time.perf_counter()
            data = json.loads(event.data)
            kind = data.get("type") or event.event
            if kind == "speech.audio.delta":
                audio = base64.b64decode(data["audio"])
                record.add_audio(now, len(audio) / PCM_BYTES_PER_SAMPLE / rate)
            elif kind == "speech.audio.done":
                record.end = now
                return
            elif kind == "error":
                record.fail("stream_error", json.dumps(data.get("error", data)), now)
                return
        record.fail("protocol", "speech stream ended without speech.audio.done", time.perf_counter())

    def _stream_rate(self, response: httpx.Response) -> int:
        header = response.headers.get("x-sample-rate")
        rate = int(header) if header else self.options.sample_rate
        if not rate:
            raise ValueError("the server sent no X-Sample-Rate header and no sample rate is known")
        return rate

    # -- transcriptions -----------------------------------------------------------------------

    async def _transcription(self, client: httpx.AsyncClient, item: BenchItem, record: RequestRecord) -> None:
        data, seconds = self.audio_file(item.audio)
        record.input_audio_seconds = seconds
        record.reference_text = item.text
        form = {"model": self.options.model, "response_format": "json",
                "stream": "true" if self.options.stream else "false"}
        files = {"file": (item.audio.name, data, "application/octet-stream")}
        async with client.stream("POST", "/v1/audio/transcriptions", data=form, files=files) as response:
            if not await _accepted(response, record):
                return
            if not self.options.stream:
                payload = json.loads(await response.aread())
                record.add_text(time.perf_counter(), payload["text"] or " ")
                return
            async for event in EventSource(response).aiter_sse():
                now = time.perf_counter()
                if event.data.strip() == "[DONE]":
                    break
                payload = json.loads(event.data)
                kind = payload.get("type") or event.event
                if kind == "transcript.text.delta":
                    record.add_text(now, payload["delta"])
                elif kind == "transcript.text.done":
                    record.end = now
                    return
                elif kind == "error":
                    record.fail("stream_error", json.dumps(payload.get("error", payload)), now)
                    return
            record.fail("protocol", "transcription stream ended without transcript.text.done",
                        time.perf_counter())

    # -- chat ---------------------------------------------------------------------------------

    def chat_body(self, item: BenchItem, stream: bool) -> dict:
        if item.audio is not None:
            data, _ = self.audio_file(item.audio)
            content: str | list = [{"type": "input_audio", "input_audio": {
                "data": base64.b64encode(data).decode(), "format": item.audio.suffix.lstrip(".") or "wav"}}]
            if item.text:
                content.insert(0, {"type": "text", "text": item.text})
        else:
            content = item.text
        body: dict = {"model": self.options.model, "messages": [{"role": "user", "content": content}],
                      "stream": stream}
        if self.options.chat_audio:
            body["modalities"] = ["text", "audio"]
            body["audio"] = {"format": "pcm16" if stream else "wav"}
            if self.options.voice:
                body["audio"]["voice"] = self.options.voice
        if stream:
            body["stream_options"] = {"include_usage": True}
        return {**body, **self.options.extra_body}

    async def _chat(self, client: httpx.AsyncClient, item: BenchItem, record: RequestRecord) -> None:
        if item.audio is not None:
            record.input_audio_seconds = self.audio_file(item.audio)[1]
        stream = self.options.stream
        async with client.stream("POST", "/v1/chat/completions", json=self.chat_body(item, stream)) as response:
            if not await _accepted(response, record):
                return
            if not stream:
                reply = json.loads(await response.aread())
                now = time.perf_counter()
                message = reply["choices"][0]["message"]
                record.output_tokens = int((reply.get("usage") or {}).get("completion_tokens") or 0)
                record.add_text(now, message.get("content") or "")
                if message.get("audio"):
                    wav = base64.b64decode(message["audio"]["data"])
                    record.add_audio(now, soundfile.info(io.BytesIO(wav)).duration)
                return
            rate = self._stream_rate(response) if self.options.chat_audio else 0
            async for event in EventSource(response).aiter_sse():
                now = time.perf_counter()
                if event.data.strip() == "[DONE]":
                    record.end = now
                    return
                chunk = json.loads(event.data)
                if "error" in chunk:
                    record.fail("stream_error", json.dumps(chunk["error"]), now)
                    return
                if chunk.get("usage"):
                    record.output_tokens = int(chunk["usage"].get("completion_tokens") or 0)
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    record.add_text(now, delta.get("content") or "")
                    if rate and (delta.get("audio") or {}).get("data"):
                        pcm = base64.b64decode(delta["audio"]["data"])
                        record.add_audio(now, len(pcm) / PCM_BYTES_PER_SAMPLE / rate)
            record.fail("protocol", "chat stream ended without [DONE]", time.perf_counter())


def _error_message(body: bytes) -> str:
    """The message of an OpenAI-shaped error body, else the body itself."""
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body.decode("utf-8", "replace")


def _raise_for_error(response: httpx.Response) -> None:
    if not response.is_success:
        raise ValueError(f"HTTP {response.status_code}: {_error_message(response.content)}")


async def _accepted(response: httpx.Response, record: RequestRecord) -> bool:
    """Records the status; for an error reads the server's message and returns False."""
    record.status = response.status_code
    if response.is_success:
        return True
    message = _error_message(await response.aread())
    record.fail("http", f"{response.status_code}: {message}", time.perf_counter())
    return False


async def _read_wav(response: httpx.Response, record: RequestRecord) -> None:
    """A whole encoded file: time to first audio is its first byte, its length is in the header."""
    parts = []
    async for piece in response.aiter_bytes():
        if record.first_audio is None:
            record.first_audio = time.perf_counter()
        parts.append(piece)
    end = time.perf_counter()
    record.add_audio(end, soundfile.info(io.BytesIO(b"".join(parts))).duration)


async def probe_sample_rate(client: httpx.AsyncClient, sender: RequestSender, item: BenchItem) -> int:
    """Learns the server's output sample rate from one whole wav response (also a warm-up)."""
    if sender.options.endpoint == "chat":
        response = await client.post("/v1/chat/completions", json=sender.chat_body(item, stream=False))
        _raise_for_error(response)
        audio = response.json()["choices"][0]["message"].get("audio") or {}
        if not audio.get("data"):
            raise ValueError("the chat reply carries no audio; does the model support audio output?")
        wav = base64.b64decode(audio["data"])
    else:
        response = await client.post("/v1/audio/speech", json=sender.speech_body(item, "wav", stream=False))
        _raise_for_error(response)
        wav = response.content
    return int(soundfile.info(io.BytesIO(wav)).samplerate)
