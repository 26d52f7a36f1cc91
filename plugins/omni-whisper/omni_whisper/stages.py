"""Workers of the three Whisper stages: frontend (fn), encoder (batch), decoder (whisper-decode).

Every factory runs in the process hosting its stage and loads weights there; stages sharing a
process share one loaded model (``load_model`` is cached per checkpoint and dtype).
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from omni_core.hooks import InvalidInput

from omni_whisper.checkpoint import WhisperCheckpoint, load_checkpoint, resolve_checkpoint_dir
from omni_whisper.cpu_threads import BUSY_DECODERS, ThreadSetter, compute_threads, encoder_workers, turn_lock
from omni_whisper.decoding import LogitRules, RequestState, Window
from omni_whisper.dtypes import resolve_dtype
from omni_whisper.features import log_mel, split_windows
from omni_whisper.model import WhisperModel
from omni_whisper.timing import alignment_weights, window_words
from omni_whisper.tokenizer import WhisperTokenizer

MAX_NEW_TOKENS = 224  # per 30 s window: half the decoder's positions, as in Whisper
MAX_PROMPT_TOKENS = 223
ENCODER_CHUNK = 2  # windows per encoder forward: bounds the attention buffers and the turn length
GPU_ENCODER_CHUNK = 32  # windows a forward on a GPU (fc1's output for 32 large-v3 windows: ~0.5 GB in float16)


_LOAD_LOCK = threading.Lock()


@lru_cache(maxsize=4)
def _load(checkpoint_dir: str, dtype_name: str, device: str) -> tuple[WhisperCheckpoint, WhisperModel, WhisperTokenizer]:
    checkpoint = load_checkpoint(resolve_checkpoint_dir(checkpoint_dir))
    if dtype_name == "int8":  # int8 weights, float32 activations (CPU only: resolve_dtype)
        model = WhisperModel.from_checkpoint(checkpoint, torch.float32).quantize_int8()
    else:
        model = WhisperModel.from_checkpoint(checkpoint, getattr(torch, dtype_name)).to(device)
    tokenizer = WhisperTokenizer(checkpoint.tokenizer_dir, checkpoint.config.vocab_size)
    checkpoint.state_dict = {}  # the model holds the weights now
    return checkpoint, model, tokenizer


def load_model(checkpoint_dir: str, dtype_name: str = "float32", device: str = "cpu"):
    """(checkpoint, model, tokenizer) with the model in ``dtype_name`` (resolved: not ``auto``)
    on ``device``; one load per process for each such triple."""
    with _LOAD_LOCK:
        return _load(str(checkpoint_dir), dtype_name, str(torch.device(device)))


def _options(context) -> dict[str, Any]:
    return dict(context.options or {})


class Frontend:
    """Checks the request and turns its audio into log-mel windows (of at most 30 s, cut in
    pauses: ``features.window_starts``). It needs the checkpoint's
    configuration and tokenizer, not its weights (wherever it runs, it holds no copy of them)."""

    def __init__(self, checkpoint_dir: str):
        self.checkpoint = load_checkpoint(resolve_checkpoint_dir(checkpoint_dir), weights=False)
        self.tokenizer = WhisperTokenizer(self.checkpoint.tokenizer_dir, self.checkpoint.config.vocab_size)

    def __call__(self, message, emit) -> None:
        payload = message.payload
        audio = payload.get("audio")
        if isinstance(audio, np.ndarray):
            audio = torch.from_numpy(audio)
        if not isinstance(audio, torch.Tensor) or audio.dim() != 1 or not audio.is_floating_point():
            raise InvalidInput("audio must be a 1-D float tensor of 16 kHz samples")
        if audio.numel() == 0:
            raise InvalidInput("audio is empty")
        if not bool(torch.isfinite(audio).all()):
            raise InvalidInput("audio contains NaN or infinite samples")
        task = self.tokenizer.check_task(payload.get("task"))
        language = self.tokenizer.check_language(payload.get("language"))  # None: the decoder detects it
        temperature = float(payload.get("temperature") or 0.0)
        if not (0.0 <= temperature <= 1.0) or math.isnan(temperature):
            raise InvalidInput("temperature must be between 0 and 1")
        prompt_text = payload.get("prompt")
        if prompt_text is not None and not isinstance(prompt_text, str):
            raise InvalidInput("prompt must be a string")
        windows, durations, offsets = split_windows(audio)
        mel = log_mel(windows, self.checkpoint.config.num_mel_bins)
        emit(
            "mel",
            {
                "mel": mel,
                "durations": durations,
                "offsets": offsets,
                "prompt": prompt_text or None,
                "task": task,
                "language": language,
                "temperature": temperature,
                "timestamps": bool(payload.get("timestamps")),
                "word_timestamps": bool(payload.get("word_timestamps")),
                "duration": audio.numel() / 16000,
            },
        )


class Encoder:
    """Encodes the windows of every request in the batch together."""

    def __init__(self, checkpoint_dir: str, dtype: str, threads: str = "shared", device: str = "cpu"):
        _, self.model, _ = load_model(checkpoint_dir, dtype, device)
        weight = self.model.encoder.conv1.weight
        self.dtype, self.device = weight.dtype, weight.device
        self.lock = turn_lock(threads)
        self.set_threads = ThreadSetter(compute_threads(threads))
        if self.device.type != "cpu":  # a GPU takes the batch's windows in few, large forwards
            self.workers, self.chunk = 1, GPU_ENCODER_CHUNK
        else:
            # int8 quantises activations per tensor: one window per forward keeps a window's result
            # independent of the windows it is batched with (pairs moved the error rate by 3 points)
            self.workers = encoder_workers(threads)
            self.chunk = 1 if self.workers > 1 or dtype == "int8" else ENCODER_CHUNK

    def _encode(self, chunk: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode(), self.lock:
            return self.model.encoder(chunk)

    def process(self, messages, emit) -> None:
        mels = torch.cat([m.payload["mel"] for m in messages]).to(self.device, self.dtype)
        chunks = mels.split(self.chunk)
        if self.workers > 1 and len(chunks) > 1:
            # a pool per batch (thread start-up is negligible next to a window) leaves no threads behind
            workers = min(self.workers, len(chunks))
            with ThreadPoolExecutor(workers, "omni-whisper-encoder", initializer=self.set_threads) as pool:
                encoded = torch.cat(list(pool.map(self._encode, chunks)))
        else:
            if self.workers > 1:  # split layout: a lone window takes every core while no decoder steps
                torch.set_num_threads(1 if BUSY_DECODERS.any() else self.workers)
            else:
                self.set_threads()
            encoded = torch.cat([self._encode(chunk) for chunk in chunks])
        start = 0
        for message in messages:
            count = message.payload["mel"].shape[0]
            payload = {k: v for k, v in message.payload.items() if k != "mel"}
            payload["encoded"] = encoded[start : start + count]
            start += count
            emit(message.request_id, "encoded", payload)


class DecoderWorker:
    """What the ``whisper-decode`` engine needs: the model, tokenizer and decoding rules."""

    def __init__(self, checkpoint_dir: str, dtype: str, threads: str = "shared", device: str = "cpu"):
        checkpoint, self.model, self.tokenizer = load_model(checkpoint_dir, dtype, device)
        self.set_threads = ThreadSetter(compute_threads(threads))
        self.lock = turn_lock(threads)
        config = checkpoint.config
        self.source_positions = config.max_source_positions
        self.rules = LogitRules(self.tokenizer, checkpoint.suppress_ids, checkpoint.begin_suppress_ids, config.vocab_size)
        # the cross-attention heads that track time; without the checkpoint's list, every head of
        # the second half of the decoder (as Whisper does)
        layers, heads = config.decoder_layers, config.decoder_attention_heads
        self.alignment_heads = checkpoint.alignment_heads or [[i, h] for i in range(layers // 2, layers) for h in range(heads)]
        codes = sorted((token_id, code) for code, token_id in self.tokenizer.languages.items())
        self.language_codes = [code for _, code in codes]
        self.language_ids = torch.tensor([token_id for token_id, _ in codes], device=self.model.decoder.embed_tokens.weight.device)

    def _timing_prompt(self, window: Window) -> list[int]:
        # the text alone is aligned (timestamp tokens dropped), after a prompt that says so
        return window.prompt if window.prompt[-1] == self.tokenizer.no_timestamps else [*window.prompt, self.tokenizer.no_timestamps]

    def alignment(self, window: Window, cross_kv: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor | None:
        """The alignment heads' weights over a finished window's prompt and text, from its row's
        cross-attention K/V in the decode batch (None without text)."""
        text = [t for t in window.tokens if t < self.tokenizer.eot]
        if not text:
            return None
        with self.lock:
            return alignment_weights(self.model, None, [*self._timing_prompt(window), *text], self.alignment_heads, cross_kv=cross_kv)

    def words(self, request: RequestState, window: Window) -> list[dict]:
        """Word timestamps of a decoded window (``timing``; from ``window.alignment`` when taken)."""
        with self.lock:
            return window_words(self.model, self.tokenizer, request.encoded[window.index], self._timing_prompt(window), window.tokens,
                                self.alignment_heads, window.offset, window.duration, weights=window.alignment)

    def new_request(self, request_id: str, payload: dict, live: bool):
        language = payload["language"] or self.detect_language(payload["encoded"][0])
        timestamps, task = bool(payload["timestamps"]), payload["task"]
        # the caller's prompt conditions the first window only, as in Whisper
        first = self.tokenizer.prompt(language, timestamps, payload["prompt"], MAX_PROMPT_TOKENS, task)
        later = self.tokenizer.prompt(language, timestamps, None, MAX_PROMPT_TOKENS, task)
        windows = [
            Window(
                request_id=request_id,
                index=index,
                offset=offset,
                duration=duration,
                prompt=list(first if index == 0 else later),
                timestamps=timestamps,
                temperature=float(payload["temperature"]),
                max_new_tokens=MAX_NEW_TOKENS,
            )
            for index, (duration, offset) in enumerate(zip(payload["durations"], payload["offsets"], strict=True))
        ]
        return RequestState(
            request_id=request_id,
            encoded=payload["encoded"],
            windows=windows,
            language=language,
            duration=float(payload["duration"]),
            live=live,
            word_timestamps=bool(payload.get("word_timestamps")),
        )

    def detect_language(self, encoded: torch.Tensor) -> str:
        """The most likely language token after ``<|startoftranscript|>`` given one window's
        encoding [S, D] (the request's first 30 s, as Whisper detects it)."""
        with torch.inference_mode(), self.lock:
            logits = self.model.decode_sequence([self.tokenizer.sot], self.model.decoder.cross_kv(encoded[None]))
        return self.language_codes[int(logits[0, self.language_ids].argmax())]


def frontend_factory(context, checkpoint_dir: str):
    return Frontend(checkpoint_dir)


def encoder_factory(context, checkpoint_dir: str, dtype: str = "float32", threads: str = "shared"):
    return Encoder(checkpoint_dir, resolve_dtype(dtype, context.device), threads, context.device)


def decoder_factory(context, checkpoint_dir: str, dtype: str = "float32", threads: str = "shared"):
    return DecoderWorker(checkpoint_dir, resolve_dtype(dtype, context.device), threads, context.device)
