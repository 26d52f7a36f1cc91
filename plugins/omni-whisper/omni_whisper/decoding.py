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
NO_SPEECH_THRESHOLD = 0.6
LOGPROB_THRESHOLD = -1.0


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
    # the alignment heads' cross-attention over its text, taken before its row left the batch
    # (word timestamps; timing.alignment_weights), so its cross K/V is not computed again
    alignment: torch.Tensor | None = None
    # the probability of the no-speech token after <|startoftranscript|> (known after the first step)
    no_speech_prob: float | None = None
    no_speech_at_admission: torch.Tensor | None = None  # when the prompt's prefill computed it

    @property
    def avg_logprob(self) -> float:
        return self.logprob_sum / max(1, len(self.tokens))

    def may_be_silent(self) -> bool:
        """The no-speech token was likely (> 0.6): whether the window is ``silent`` waits on its text."""
        return (self.no_speech_prob or 0.0) > NO_SPEECH_THRESHOLD

    def silent(self) -> bool:
        """Whisper's test for a window without speech: the no-speech token was likely and the
        text is not (mean log-probability <= -1); its text is dropped."""
        return self.may_be_silent() and self.avg_logprob <= LOGPROB_THRESHOLD


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
        self.vocab_ids = torch.arange(vocab)

    def apply(self, logits: torch.Tensor, windows: list[Window]) -> None:
        neg = float("-inf")
        if self.suppress.device != logits.device:  # once: the masks move to the decoder's device
            for name in ("suppress", "begin", "no_timestamp_mask", "with_timestamp_mask", "vocab_ids"):
                setattr(self, name, getattr(self, name).to(logits.device))
        # each row's two flags (timestamps on, nothing decoded yet) in one copy to the device
        stamped, first = torch.tensor([[w.timestamps, not w.tokens] for w in windows], device=logits.device).T
        static = torch.where(stamped[:, None], self.with_timestamp_mask, self.no_timestamp_mask)
        static = static | (first[:, None] & self.begin)
        logits.masked_fill_(static, neg)
        stamped_rows = [row for row, window in enumerate(windows) if window.timestamps]
        if not stamped_rows:
            return
        # on CPU a decision per row costs nothing (no device to wait for); on a GPU each waits for
        # the device, so from two rows on they are all decided there at once (H200, fp16, vocab
        # 51865: 16 rows 3.17 -> 0.44 ms, 32 rows 6.08 -> 0.47 ms; one row 0.26 ms alone, 0.36 batched)
        if logits.device.type == "cpu" or len(stamped_rows) == 1:
            for row in stamped_rows:
                self._row_timestamp_rules(logits[row], windows[row].tokens)
        else:
            self._batch_timestamp_rules(logits, stamped_rows, windows)

    def _row_timestamp_rules(self, logits: torch.Tensor, tokens: list[int]) -> None:
        """Whisper's timestamp rules on one row: its banned spans, then text banned where the
        timestamps together are more likely than any text token."""
        begin, neg = self.tok.timestamp_begin, float("-inf")
        lo0, hi0, lo1, hi1 = self._banned_spans(tokens, logits.shape[-1])
        logits[lo0:hi0] = neg
        logits[lo1:hi1] = neg
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        if torch.logsumexp(logprobs[begin:], dim=-1) > logprobs[:begin].max():
            logits[:begin] = neg

    def _batch_timestamp_rules(self, logits: torch.Tensor, rows: list[int], windows: list[Window]) -> None:
        """The same rules on several rows with no host sync: the rows' spans as one mask (one copy
        of their bounds), the text ban decided on the device."""
        begin, vocab, neg = self.tok.timestamp_begin, logits.shape[-1], float("-inf")
        table = torch.tensor([[row, *self._banned_spans(windows[row].tokens, vocab)] for row in rows], device=logits.device)
        index, bounds = table[:, 0], table[:, 1:].view(len(rows), 2, 2)
        banned = ((self.vocab_ids >= bounds[..., :1]) & (self.vocab_ids < bounds[..., 1:])).any(dim=1)
        whole = len(rows) == len(logits)  # every row: no gather and scatter
        picked = logits.masked_fill_(banned, neg) if whole else logits.index_select(0, index).masked_fill_(banned, neg)
        logprobs = torch.log_softmax(picked.float(), dim=-1)
        text_banned = torch.logsumexp(logprobs[:, begin:], dim=-1) > logprobs[:, :begin].max(dim=-1).values
        picked[:, :begin].masked_fill_(text_banned[:, None], neg)
        if not whole:
            logits.index_copy_(0, index, picked)

    def _banned_spans(self, tokens: list[int], vocab: int) -> list[int]:
        """The token spans [lo, hi) a row's history bans, as lo0, hi0, lo1, hi1 (empty spans: 0, 0):
        after a timestamp pair, timestamps (text or the end comes next); after text closed by one
        timestamp, text (its closing timestamp comes next); timestamps before the last one (not
        before the last one itself when it still has to close its segment); at the start, text and
        timestamps past ``MAX_INITIAL_TIMESTAMP``."""
        begin, eot = self.tok.timestamp_begin, self.tok.eot
        if not tokens:
            return [0, begin, begin + MAX_INITIAL_TIMESTAMP + 1, vocab]
        spans = [0, 0, 0, 0]
        last_ts = tokens[-1] >= begin
        penultimate_ts = len(tokens) < 2 or tokens[-2] >= begin
        if last_ts:
            spans[:2] = [begin, vocab] if penultimate_ts else [0, eot]
        last_stamp = next((t for t in reversed(tokens) if t >= begin), None)
        if last_stamp is not None:
            spans[2:] = [begin, last_stamp if last_ts and not penultimate_ts else last_stamp + 1]
        return spans


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
