"""The frontend stage: validates a transcription request, cuts long audio into chunks at quiet
points, computes each chunk's log-mel features and tokenizes its prompt."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from omni_core.hooks import InvalidInput, number_option

from .config import audio_token_count, load_config
from .features import FeatureSettings, LogMel
from .text import build_prompt, language_name
from .tokenizer import load_tokenizer

QUIET_FRAME_SECONDS = 0.02


def split_audio(audio: np.ndarray, sample_rate: int, chunk_seconds: float, search_seconds: float = 5.0):
    """Cut ``audio`` into pieces of at most ``chunk_seconds``, each cut placed at the quietest
    20 ms within the last ``search_seconds`` before the limit. Returns [(start, stop)] samples."""
    limit = int(chunk_seconds * sample_rate)
    frame = max(1, int(QUIET_FRAME_SECONDS * sample_rate))
    spans, start = [], 0
    while audio.size - start > limit:
        search = min(search_seconds, chunk_seconds / 2)
        lo = start + max(frame, limit - int(search * sample_rate))
        region = audio[lo : start + limit]
        usable = region.size // frame * frame
        energy = (region[:usable].reshape(-1, frame) ** 2).sum(axis=1)
        cut = lo + int(np.argmin(energy)) * frame if energy.size else start + limit
        spans.append((start, cut))
        start = cut
    spans.append((start, audio.size))
    return spans



def frontend_settings(options: dict) -> tuple[float, float, float, int]:
    """(chunk_seconds, max_audio_seconds, max_tokens_per_second, min_new_tokens) from the build
    options; a bad value raises ValueError naming it (a chunk of 0 s would never advance)."""
    return (
        number_option(options, "chunk_seconds", 30.0, float),
        number_option(options, "max_audio_seconds", 3 * 3600, float),
        number_option(options, "max_tokens_per_second", 12.0, float),
        number_option(options, "min_new_tokens", 32, allow_zero=True),
    )

class Frontend:
    def __init__(self, checkpoint_dir: str, options: dict[str, Any]):
        self.config = load_config(checkpoint_dir)
        self.settings = FeatureSettings.from_dir(checkpoint_dir)
        self.log_mel = LogMel(self.settings)
        self.tokenizer = load_tokenizer(checkpoint_dir)
        self.special_tokens = sorted(
            {t.content for t in self.tokenizer.added_tokens_decoder.values()}, key=len, reverse=True
        )
        self.chunk_seconds, self.max_audio_seconds, self.tokens_per_second, self.min_new_tokens = frontend_settings(options)

    def prepare(self, payload: dict[str, Any]) -> dict[str, Any]:
        audio = payload.get("audio")
        if audio is None:
            raise InvalidInput("transcription needs 'audio'")
        if hasattr(audio, "detach"):
            audio = audio.detach().cpu().numpy()
        audio = np.asarray(audio, dtype=np.float32)
        if audio.ndim == 2:  # several channels: mix down
            audio = audio.mean(axis=0 if audio.shape[0] < audio.shape[1] else 1)
        if audio.ndim != 1 or audio.size == 0:
            raise InvalidInput(f"audio must be non-empty mono samples, got shape {tuple(audio.shape)}")
        if not np.isfinite(audio).all():
            raise InvalidInput("audio contains NaN or infinite samples")
        rate = self.settings.sampling_rate
        duration = audio.size / rate
        if duration > self.max_audio_seconds:
            raise InvalidInput(f"audio lasts {duration:.0f} s; the limit is {self.max_audio_seconds:.0f} s")
        language = language_name(payload.get("language"))
        context = self._plain(payload.get("prompt") or "")
        temperature = float(payload.get("temperature") or 0.0)
        if not 0.0 <= temperature <= 2.0:
            raise InvalidInput("temperature must be between 0 and 2")

        mels, frames, spans, prompts, budgets = [], [], [], [], []
        for start, stop in split_audio(audio, rate, self.chunk_seconds):
            mel = self.log_mel(audio[start:stop])
            tokens = audio_token_count(mel.shape[1], self.config.encoder.n_window)
            prompt = build_prompt(tokens, context, language)
            mels.append(mel)
            frames.append(mel.shape[1])
            spans.append([round(start / rate, 3), round(stop / rate, 3)])
            prompts.append(self.tokenizer.encode(prompt, add_special_tokens=False))
            budgets.append(self.min_new_tokens + math.ceil(self.tokens_per_second * (stop - start) / rate))
        return {
            "mel": np.concatenate(mels, axis=1),
            "chunk_frames": frames,
            "chunk_spans": spans,
            "prompt_ids": prompts,
            "max_new_tokens": budgets,
            "language": language,
            "temperature": temperature,
            "duration": round(duration, 3),
        }

    def _plain(self, context: str) -> str:
        """The user's context without control tokens, so it cannot end its turn or fake audio."""
        if not isinstance(context, str):
            raise InvalidInput("prompt must be a string")
        for token in self.special_tokens:
            context = context.replace(token, "")
        return context


def make_frontend(checkpoint_dir: str, options: dict[str, Any], context=None):
    """Factory of the ``fn`` frontend stage: ``worker(message, emit)``."""
    frontend = Frontend(checkpoint_dir, options)

    def worker(message, emit):
        emit("features", frontend.prepare(message.payload), True)

    return worker
