"""The ``frontend`` stage: a speech request -> the dual AR's prompt (``prompt``).

Voices: ``default`` (the model's own voice: no reference), or reference audio with its
transcript (zero-shot cloning; a saved voice arrives as reference audio too). The reference is
held to ``REFERENCE_LIMITS``, resampled to the codec's rate and encoded into frames of codes by
the codec's encoder; the last ``REFERENCE_CACHE`` encodings are kept, keyed by the samples (a
saved voice is the same recording on every request).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
from omni_core.hooks import InvalidInput

from .codec import Codec
from .config import TokenIds
from .prompt import build_prompt, reserved_in
from .reference import REFERENCE_LIMITS
from .text_normalize import normalize_text

DEFAULT_VOICE = "default"
REFERENCE_CACHE = 32


class Frontend:
    def __init__(self, tokenizer, ids: TokenIds, codec: Codec):
        self.tokenizer = tokenizer
        self.ids = ids
        self.codec = codec
        self.device = next(codec.parameters()).device
        self._references: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()

    def reference_codes(self, audio: Any, sample_rate: Any) -> torch.Tensor:
        """A reference recording -> its codes [num_codebooks, frames] (shared: read only)."""
        if not isinstance(sample_rate, int) or isinstance(sample_rate, bool):
            raise InvalidInput(
                f"reference_sample_rate must be an integer, got {sample_rate!r}", "reference_audio"
            )
        wav = audio.detach().cpu().numpy() if isinstance(audio, torch.Tensor) else np.asarray(audio)
        if wav.ndim != 1 or wav.dtype.kind != "f":
            raise InvalidInput(
                f"reference_audio must be mono float samples, got shape {wav.shape} dtype {wav.dtype}",
                "reference_audio",
            )
        problem = REFERENCE_LIMITS.problem(len(wav) / max(sample_rate, 1), sample_rate)
        if problem:
            raise InvalidInput(f"fish-s2pro: {problem}", "reference_audio", code="unusable_reference")
        if not np.isfinite(wav).all():
            raise InvalidInput("reference_audio contains NaN or infinite samples", "reference_audio")
        key = hashlib.blake2b(
            np.ascontiguousarray(wav, dtype=np.float32).tobytes() + sample_rate.to_bytes(4, "little"),
            digest_size=16,
        ).digest()
        with self._lock:
            if key in self._references:
                self._references.move_to_end(key)
                return self._references[key]
        peak = float(np.abs(wav).max())
        if peak > 1.0:  # past full scale (a float file): the codec expects [-1, 1]
            wav = wav / peak
        if sample_rate != self.codec.sample_rate:
            import soxr

            wav = soxr.resample(wav.astype(np.float32), sample_rate, self.codec.sample_rate)
        samples = torch.from_numpy(np.ascontiguousarray(wav, dtype=np.float32)).to(self.device)
        codes = self.codec.encode(samples[None])[0].cpu()
        with self._lock:
            self._references[key] = codes
            while len(self._references) > REFERENCE_CACHE:
                self._references.popitem(last=False)
        return codes

    def prompt(self, payload: dict[str, Any]):
        text = payload.get("text")
        if not isinstance(text, str) or not text.strip():
            raise InvalidInput("text must be a non-empty string", "input")
        if payload.get("instructions"):
            raise InvalidInput(
                "fish-s2pro takes no instructions: give reference audio to choose the voice", "instructions"
            )
        if float(payload.get("speed") or 1.0) != 1.0:
            raise InvalidInput("fish-s2pro speaks at its own speed: speed must be 1.0", "speed")
        for field, value in (("input", text), ("reference_text", payload.get("reference_text") or "")):
            token = reserved_in(value)
            if token:
                raise InvalidInput(f"{field} may not contain the control token {token!r}", field)
        spoken = normalize_text(text)
        if not spoken:
            raise InvalidInput("input has nothing to speak once its emoji are dropped", "input")
        codes = None
        if payload.get("reference_audio") is not None:
            codes = self.reference_codes(payload["reference_audio"], payload.get("reference_sample_rate"))
        elif payload.get("voice") not in (None, DEFAULT_VOICE):
            raise InvalidInput(
                f"unknown voice {payload['voice']!r}; built-in voices: ['{DEFAULT_VOICE}']",
                "voice",
                code="unknown_voice",
            )
        return build_prompt(
            self.tokenizer,
            self.ids,
            spoken,
            normalize_text(payload.get("reference_text") or ""),
            codes,
            self.codec.num_codebooks,
        )


class FrontendWorker:
    """Entry payload -> ``prompt`` (token ids, the reference's frames, seed and sampling)."""

    def __init__(self, frontend: Frontend):
        self.frontend = frontend

    def __call__(self, message, emit) -> None:
        payload = message.payload
        prompt = self.frontend.prompt(payload)
        emit(
            "prompt",
            {
                "token_ids": prompt.token_ids,
                "frames": prompt.frames,
                "turn_start": prompt.turn_start,
                "segment": payload.get("segment"),
                "seed": payload.get("seed"),
                "sampling": dict(payload.get("sampling") or {}),
            },
        )
