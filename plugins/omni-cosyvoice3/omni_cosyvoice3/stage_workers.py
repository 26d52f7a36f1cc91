"""Workers of the frontend (fn), flow (batch) and hift (batch) stages.

The flow and hift workers keep per-request state keyed by request id (freed on the last chunk
or by ``release``) and run one forward for all the requests of a batch that are due. Each
stream message is applied once even if the executor retries a batch (its seq is remembered).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from omni_core.scheduler.applied_messages import AppliedMessages
from omni_core.scheduler.host_copy import to_host
from omni_core.scheduler.stage_stream import StageStream

from .chunking import FlowStream
from .flow import FlowModel, FlowRequest
from .flow_cache import FlowCache
from .frontend import Frontend, parse_speed
from .hift import WINDOW_CONTEXT, HiftGenerator, HiftWindow, pitch_known_from


class FrontendWorker:
    """Entry payload -> ``llm`` (prompt) and ``cond`` (the flow's speaker conditioning)."""

    def __init__(self, frontend: Frontend, chunk_hop: int, max_hop: int = 100):
        self.frontend = frontend
        self.chunk_hop = chunk_hop
        self.max_hop = max_hop

    def __call__(self, message, emit) -> None:
        payload = message.payload
        speed = parse_speed(payload.get("speed"))
        prepared = self.frontend.prepare(payload)
        emit(
            "cond",
            {
                "prompt_tokens": prepared.flow_prompt_tokens,
                "prompt_mel": prepared.prompt_mel,
                "embedding": prepared.embedding,
                "streaming": bool(payload.get("stream", True)),
                "speed": speed,
                "input_tokens": len(prepared.text_ids),
            },
        )
        emit(
            "llm",
            {
                "text_ids": prepared.text_ids,
                "target_text_len": prepared.target_text_len,
                "llm_prompt_tokens": prepared.llm_prompt_tokens,
                "seed": payload.get("seed"),
                "sampling": payload.get("sampling") or {},
                # the flow's chunk schedule, so the llm sends tokens when a chunk is due
                "flow_prompt_len": len(prepared.flow_prompt_tokens),
                "hop": self.chunk_hop,
                "max_hop": self.max_hop,
                "streaming": bool(payload.get("stream", True)),
            },
        )


class FlowWorker:
    def __init__(
        self, model: FlowModel, hop: int, max_hop: int, cache: FlowCache | None = None, masked_last: bool = False
    ):
        self.model = model
        self.cache = cache  # streamed requests' finished frames (None: every call recomputes all)
        self.masked_last = masked_last  # a streamed request's last call under the chunk mask too
        self.stream = StageStream(model.input_embedding.weight.device)
        self.hop, self.max_hop = hop, max_hop
        self.streams: dict[str, FlowStream] = {}
        self.extra: dict[str, dict[str, Any]] = {}
        self.early: dict[str, list] = {}  # token messages that beat their conditioning
        self.applied = AppliedMessages()

    def _apply(self, message) -> None:
        rid, p = message.request_id, message.payload
        if message.port == "cond":
            self.streams[rid] = FlowStream(
                prompt_tokens=[int(t) for t in p["prompt_tokens"]],
                prompt_mel=torch.as_tensor(p["prompt_mel"]).float(),
                embedding=torch.as_tensor(p["embedding"]).float(),
                streaming=bool(p.get("streaming", True)),
                hop=self.hop,
                max_hop=self.max_hop,
                lookahead=self.model.cfg.pre_lookahead_len,
            )
            self.extra[rid] = {
                "speed": float(p.get("speed", 1.0)),
                "input_tokens": int(p.get("input_tokens", 0)),
            }
            for early in self.early.pop(rid, []):
                self._apply(early)
            return
        stream = self.streams.get(rid)
        if stream is None:
            self.early.setdefault(rid, []).append(message)
            return
        stream.tokens.extend(int(t) for t in p.get("token_ids", []))
        stream.finished = stream.finished or message.end

    def process(self, messages, emit) -> None:
        with self.stream():
            self._process(messages, emit)

    def _process(self, messages, emit) -> None:
        touched = []
        for message in messages:
            if self.applied.fresh(message):
                self._apply(message)
            touched.append(message.request_id)
        jobs = []
        for rid in dict.fromkeys(touched):
            stream = self.streams.get(rid)
            due = stream.next_end() if stream is not None else None
            if due is not None:
                jobs.append((rid, stream, *due))
        runnable = [
            j for j in jobs if j[2] > j[1].offset
        ]  # a final call with no new tokens only ends the stream
        mels = {}
        if runnable:
            requests = [
                # the last call attends over all the tokens (streaming off), as the reference's last
                # token2wav call of a streamed request does, unless masked_last
                FlowRequest(
                    s.flow_tokens(end, final),
                    len(s.prompt_tokens),
                    s.prompt_mel,
                    s.embedding,
                    final,
                    s.streaming and (self.masked_last or not final),
                    first_frame=s.offset * self.model.cfg.token_mel_ratio,
                    request_id=rid,
                )
                for rid, s, end, final in runnable
            ]
            for (rid, *_), mel in zip(runnable, self.model.infer(requests, self.cache), strict=True):
                mels[rid] = mel
        ratio, bins = self.model.cfg.token_mel_ratio, self.model.cfg.mel_bins
        # only the new frames (from the offset on) leave the device, all requests' in one copy
        pieces = [
            mels[rid][:, : (end - s.offset) * ratio].float().reshape(-1)
            for rid, s, end, _ in jobs
            if rid in mels
        ]
        host = iter(to_host(torch.cat(pieces)).split([p.numel() for p in pieces]) if pieces else ())
        for rid, stream, end, final in jobs:
            delta = next(host) if rid in mels else torch.zeros(0)
            delta = delta.view(bins, delta.numel() // bins)
            payload = {"mel": delta, "speed": self.extra[rid]["speed"]}
            if final:
                payload["usage"] = {
                    "input_tokens": self.extra[rid]["input_tokens"],
                    "output_tokens": len(stream.tokens),
                }
            stream.advance(end, final)
            emit(rid, "mel", payload, end=final)
            if final:
                self.release(rid)

    def release(self, request_id: str) -> None:
        if self.cache is not None:
            self.cache.free(request_id)
        self.streams.pop(request_id, None)
        self.extra.pop(request_id, None)
        self.early.pop(request_id, None)
        self.applied.forget(request_id)


@dataclass
class VocodedStream:
    """One request at the vocoder: its mel from the next window's first frame on, and how far it went."""

    mel: torch.Tensor  # [80, frames] from absolute frame ``first``
    first: int = 0
    phase: torch.Tensor | None = None  # the excitation's phase for the next window (hift.HiftWindow)
    sent: int = 0  # samples sent

    @property
    def frames(self) -> int:
        return self.first + self.mel.shape[1]


def stretched_frames(frames: int, speed: float) -> int:
    """Frames of a mel chunk of ``frames`` once stretched for ``speed``."""
    return max(1, int(frames / speed)) if frames and speed != 1.0 else frames


class HiftWorker:
    """Vocodes each stream in windows (``hift.HiftWindow``): a call runs from ``WINDOW_CONTEXT``
    frames before the first sample it sends, continuing the excitation's phase from the call
    before; it sends the samples later frames can no longer change."""

    def __init__(self, model: HiftGenerator):
        self.model = model
        self.stream = StageStream(model.conv_post.weight.device)
        self.streams: dict[str, VocodedStream] = {}
        self.applied = AppliedMessages()

    def process(self, messages, emit) -> None:
        with self.stream():
            self._process(messages, emit)

    def _process(self, messages, emit) -> None:
        rows = []
        for message in messages:
            rid, p = message.request_id, message.payload
            if self.applied.fresh(message):
                chunk = torch.as_tensor(p.get("mel", torch.zeros(80, 0))).float()
                size = stretched_frames(chunk.shape[1], float(p.get("speed", 1.0)))
                if size != chunk.shape[1]:
                    chunk = F.interpolate(chunk[None], size=size, mode="linear")[0]
                stream = self.streams.get(rid)
                if stream is None:
                    self.streams[rid] = VocodedStream(chunk)
                else:
                    stream.mel = torch.cat([stream.mel, chunk], dim=1)
            elif rid not in self.streams:
                continue
            rows.append((self.streams[rid], rid, message.end, p.get("usage")))
        if not rows:
            return
        per_frame = self.model.cfg.samples_per_frame
        # per row: the samples it sends now, absolute
        ends = [max(s.sent, self.model.stable_samples(s.frames, end)) for s, _, end, _ in rows]
        # one padded batch (the vocoder keeps each row's samples up to its own end as if alone);
        # only the new samples leave the device, in one copy
        todo = [i for i, (s, *_) in enumerate(rows) if ends[i] > s.sent]
        deltas: dict[int, torch.Tensor] = {}
        if todo:
            windows = [_window(rows[i][0], ends[i] // per_frame) for i in todo]
            outs = self.model.infer_windows(windows)
            pieces = [
                audio[rows[i][0].sent - w.start * per_frame : ends[i] - w.start * per_frame]
                for i, w, (audio, _) in zip(todo, windows, outs, strict=True)
            ]
            host = to_host(torch.cat(pieces)).split([p.numel() for p in pieces])
            deltas = dict(zip(todo, host, strict=True))
            for i, (_, carry) in zip(todo, outs, strict=True):  # state moves on once the call succeeded
                _advance(rows[i][0], ends[i] // per_frame, carry.clone())
        for i, (stream, rid, end, usage) in enumerate(rows):
            stream.sent = ends[i]
            delta = deltas.get(i, torch.zeros(0))
            payload: dict[str, Any] = {"audio": delta.contiguous()}
            if end and usage:
                payload["usage"] = usage
            if delta.numel() or end:
                emit(rid, "audio", payload, end=end)
            if end:
                self.release(rid)

    def release(self, request_id: str) -> None:
        self.streams.pop(request_id, None)
        self.applied.forget(request_id)


def _window_start(sent_frames: int) -> int:
    """A window's first frame: the decoder's reach before the first frame it sends."""
    return max(0, sent_frames - WINDOW_CONTEXT)


def _window(stream: VocodedStream, sent_after: int) -> HiftWindow:
    """The stream's window now, asking for the phase where its next window (once ``sent_after``
    frames are sent) knows its own pitch from."""
    carry_at = pitch_known_from(_window_start(sent_after)) - stream.first
    return HiftWindow(stream.mel, stream.first, stream.phase, carry_at)


def _advance(stream: VocodedStream, sent_after: int, carry: torch.Tensor) -> None:
    """Keep the mel the next window needs, and its phase (a copy: not a view holding the call's audio)."""
    start = _window_start(sent_after)
    stream.mel, stream.first, stream.phase = stream.mel[:, start - stream.first :], start, carry
