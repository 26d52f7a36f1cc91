"""Per-step decoding rules for a batch of Whisper sequences, and turning tokens into segments.

Rules follow the original Whisper decoder: suppressed tokens everywhere, a blank or end of text
never first, and with timestamps: they come in pairs, never go backwards, the first token is a
timestamp no later than 1 s, and a timestamp wins whenever the timestamps together are more
likely than any single text token.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field

import torch

from omni_whisper.tokenizer import WhisperTokenizer

MAX_INITIAL_TIMESTAMP = 50  # 1.0 s in 20 ms steps


@dataclass
class Window:
    """One 30 s window of one request being decoded."""

    request_id: str
    index: int
    offset: float  # seconds from the start of the request's audio
    duration: float
    prompt: list[int]
    timestamps: bool
    temperature: float
    max_new_tokens: int
    tokens: list[int] = field(default_factory=list)
    logprob_sum: float = 0.0
    attempt: int = 0


@dataclass
class RequestState:
    """A transcription or translation request in the decoder: its windows and what of its text was sent."""

    request_id: str
    encoded: torch.Tensor  # [W, S, D]
    windows: list[Window]
    language: str  # given, or detected from the first window
    duration: float
    live: bool  # stream tokens as they decode (no fallback can revise them)
    word_timestamps: bool = False  # segments carry "words" (timing.py)
    done: dict[int, Window] = field(default_factory=dict)
    emit_index: int = 0  # window whose text streams now
    sent: str = ""  # text of that window already sent
    text: str = ""  # all text sent so far
    seq: int = 0


class LogitRules:
    """Builds the masks once; ``apply`` edits a batch of logits in place."""

    def __init__(self, tokenizer: WhisperTokenizer, suppress_ids: list[int], begin_suppress_ids: list[int], vocab: int):
        self.tok = tokenizer
        self.vocab = vocab
        base = torch.zeros(vocab, dtype=torch.bool)
        ids = [i for i in suppress_ids if 0 <= i < vocab]
        ids += [tokenizer.sot, tokenizer.sot_prev, tokenizer.transcribe, tokenizer.transcribe - 1]
        base[ids] = True
        self.suppress = base
        self.begin = torch.zeros(vocab, dtype=torch.bool)
        self.begin[[i for i in begin_suppress_ids if 0 <= i < vocab]] = True
        self.no_timestamp_mask = base.clone()
        self.no_timestamp_mask[tokenizer.timestamp_begin :] = True
        self.with_timestamp_mask = base.clone()
        self.with_timestamp_mask[tokenizer.no_timestamps] = True

    def apply(self, logits: torch.Tensor, windows: list[Window]) -> None:
        neg = float("-inf")
        if self.suppress.device != logits.device:  # once: the masks move to the decoder's device
            for name in ("suppress", "begin", "no_timestamp_mask", "with_timestamp_mask"):
                setattr(self, name, getattr(self, name).to(logits.device))
        # each row's two flags (timestamps on, nothing decoded yet) in one copy to the device
        stamped, first = torch.tensor([[w.timestamps, not w.tokens] for w in windows], device=logits.device).T
        static = torch.where(stamped[:, None], self.with_timestamp_mask, self.no_timestamp_mask)
        static = static | (first[:, None] & self.begin)
        logits.masked_fill_(static, neg)
        for row, window in enumerate(windows):
            if window.timestamps:
                self._timestamp_rules(logits[row], window)

    def _timestamp_rules(self, logits: torch.Tensor, window: Window) -> None:
        begin, eot, neg = self.tok.timestamp_begin, self.tok.eot, float("-inf")
        tokens = window.tokens
        last_ts = len(tokens) >= 1 and tokens[-1] >= begin
        penultimate_ts = len(tokens) < 2 or tokens[-2] >= begin
        if last_ts:
            if penultimate_ts:  # a segment just closed: text (or end) comes next
                logits[begin:] = neg
            else:  # a segment's text ended: its closing timestamp comes next
                logits[:eot] = neg
        stamps = [t for t in tokens if t >= begin]
        if stamps:
            floor = stamps[-1] if last_ts and not penultimate_ts else stamps[-1] + 1
            logits[begin:floor] = neg
        if not tokens:
            logits[:begin] = neg
            logits[begin + MAX_INITIAL_TIMESTAMP + 1 :] = neg
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        if torch.logsumexp(logprobs[begin:], dim=-1) > logprobs[:begin].max():
            logits[:begin] = neg


def compression_ratio(text: str) -> float:
    raw = text.encode("utf-8")
    return len(raw) / max(1, len(gzip.compress(raw)))


def window_segments(tok: WhisperTokenizer, window: Window) -> list[dict]:
    """Segments of a finished window with absolute times; without timestamps, one segment."""
    tokens = [t for t in window.tokens if t != tok.eot]
    end_limit = window.offset + window.duration
    if not window.timestamps:
        text = tok.decode(tokens)
        return [{"start": window.offset, "end": end_limit, "text": text}] if text.strip() else []
    segments: list[dict] = []
    start: float | None = None
    text_ids: list[int] = []
    for token in tokens:
        if tok.is_timestamp(token):
            stamp = min(window.offset + tok.timestamp_seconds(token), end_limit)
            if start is None or not text_ids:
                start = stamp
            else:
                segments.append({"start": start, "end": stamp, "text": tok.decode(text_ids)})
                start, text_ids = None, []
        else:
            text_ids.append(token)
    if text_ids and tok.decode(text_ids).strip():  # text without a closing timestamp runs to the end
        segments.append({"start": window.offset if start is None else start, "end": end_limit, "text": tok.decode(text_ids)})
    return [s for s in segments if s["text"].strip()]
