"""Request -> what the llm and the flow need: prompt text ids, speech tokens, x-vector, prompt mel.

Voices:
- reference audio (+ its transcript): zero-shot cloning. The reference is cut to whole speech
  tokens; its tokens prompt both the llm (when a transcript is given) and the flow.
- a built-in voice from spk2info.pt: its x-vector (and its prompt, when the entry has one).
- instructions: the llm is prompted with them instead of the reference speech tokens.
The llm text is ``<system>[ instructions]<|endofprompt|>[reference transcript]`` + the text.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from omni_core.hooks import InvalidInput

from .features import kaldi_fbank, prompt_mel, resample, whisper_log_mel
from .reference import REFERENCE_LIMITS
from .text_tokenizer import DEFAULT_SYSTEM, ENDOFPROMPT, TextTokenizer, normalize_text

MAX_TEXT_CHARS = 4000
SPEED_RANGE = (0.25, 4.0)
# encoded references kept, keyed by their samples: a saved voice arrives as the same recording on
# every request, and each segment of a long text brings its request's reference again
REFERENCE_CACHE = 32


@dataclass
class Prepared:
    text_ids: list[int]  # prompt text + text
    target_text_len: int  # tokens of the text to speak (length limits count these)
    llm_prompt_tokens: list[int]
    flow_prompt_tokens: list[int]
    prompt_mel: torch.Tensor  # [2 * len(flow_prompt_tokens), 80]
    embedding: torch.Tensor  # [192]


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(os.environ.get("OMNI_ONNX_THREADS", "1"))
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class Frontend:
    def __init__(self, checkpoint_dir: str | Path, speakers: dict[str, dict], sample_rate: int = 24000):
        directory = Path(checkpoint_dir)
        self.tokenizer = TextTokenizer(directory / "CosyVoice-BlankEN")
        self.speech_tokenizer = _session(directory / "speech_tokenizer_v3.onnx")
        self.speaker_model = _session(directory / "campplus.onnx")
        self.speakers = speakers
        self.sample_rate = sample_rate
        self._references: OrderedDict[tuple, tuple[list[int], torch.Tensor, torch.Tensor]] = OrderedDict()
        self._references_lock = threading.Lock()
        self.reference_hits = self.reference_misses = 0

    # -- audio ------------------------------------------------------------------------------
    def speech_tokens(self, audio_16k: np.ndarray) -> list[int]:
        feats = whisper_log_mel(audio_16k)[None]
        names = [i.name for i in self.speech_tokenizer.get_inputs()]
        out = self.speech_tokenizer.run(
            None, {names[0]: feats, names[1]: np.array([feats.shape[2]], dtype=np.int32)}
        )
        return [int(t) for t in np.asarray(out[0]).reshape(-1)]

    def speaker_embedding(self, audio_16k: np.ndarray) -> torch.Tensor:
        feats = kaldi_fbank(audio_16k)[None]
        name = self.speaker_model.get_inputs()[0].name
        return torch.from_numpy(
            np.asarray(self.speaker_model.run(None, {name: feats})[0], dtype=np.float32).reshape(-1)
        )

    def reference(self, audio: Any, sample_rate: Any) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """(speech tokens, prompt mel [2 * tokens, 80], x-vector [192]) of a reference recording;
        the last ``REFERENCE_CACHE`` recordings' are kept (the tensors are shared: read only)."""
        if not isinstance(sample_rate, int) or isinstance(sample_rate, bool):
            raise InvalidInput(f"reference_sample_rate must be an integer, got {sample_rate!r}")
        wav = audio.detach().cpu().numpy() if isinstance(audio, torch.Tensor) else np.asarray(audio)
        if wav.ndim != 1 or wav.dtype.kind != "f":
            raise InvalidInput(
                f"reference_audio must be mono float samples, got shape {wav.shape} dtype {wav.dtype}"
            )
        problem = REFERENCE_LIMITS.problem(len(wav) / max(sample_rate, 1), sample_rate)
        if problem:
            raise InvalidInput(problem)
        if not np.isfinite(wav).all():
            raise InvalidInput("reference_audio contains NaN or infinite samples")
        key = (sample_rate, str(wav.dtype), hashlib.blake2b(np.ascontiguousarray(wav).tobytes(), digest_size=16).digest())
        with self._references_lock:
            encoded = self._references.get(key)
            if encoded is not None:
                self._references.move_to_end(key)
                self.reference_hits += 1
                return list(encoded[0]), encoded[1], encoded[2]
        peak = float(np.abs(wav).max())
        if peak > 1.0:  # past full scale (a float file): the log-mels of 1e19 overflow to NaN
            wav = wav / peak
        wav16 = resample(wav, sample_rate, 16000)
        wav24 = resample(wav, sample_rate, self.sample_rate)
        tokens = self.speech_tokens(wav16)
        mel = prompt_mel(wav24)
        usable = min(mel.shape[0] // 2, len(tokens))
        encoded = (tokens[:usable], mel[: 2 * usable], self.speaker_embedding(wav16))
        if min(tokens, default=0) < 0 or not torch.isfinite(encoded[1]).all() or not torch.isfinite(encoded[2]).all():
            raise InvalidInput("reference_audio could not be encoded (its features are not finite)")
        with self._references_lock:
            self.reference_misses += 1
            self._references[key] = encoded
            while len(self._references) > REFERENCE_CACHE:
                self._references.popitem(last=False)
        return list(encoded[0]), encoded[1], encoded[2]

    # -- request ----------------------------------------------------------------------------
    def prepare(self, payload: dict[str, Any]) -> Prepared:
        text = payload.get("text")
        if not isinstance(text, str) or not text.strip():
            raise InvalidInput("text must be a non-empty string")
        if len(text) > MAX_TEXT_CHARS:
            raise InvalidInput(f"text is {len(text)} characters; the limit is {MAX_TEXT_CHARS}")
        instructions = payload.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise InvalidInput("instructions must be a string")
        reference_text = payload.get("reference_text")
        prompt_ids: list[int] | None = None
        llm_prompt: list[int] = []
        flow_prompt: list[int] = []
        mel = torch.zeros(0, 80)
        if payload.get("reference_audio") is not None:
            flow_prompt, mel, embedding = self.reference(
                payload["reference_audio"], payload.get("reference_sample_rate")
            )
            if reference_text:
                llm_prompt = list(flow_prompt)
        else:
            voice = payload.get("voice") or ("default" if "default" in self.speakers else None)
            if voice is None:
                raise InvalidInput("give a voice or reference audio: this checkpoint has no built-in voices")
            if voice not in self.speakers:
                raise InvalidInput(f"unknown voice {voice!r}; built-in voices: {sorted(self.speakers)}")
            entry = self.speakers[voice]
            embedding = entry.get("flow_embedding", entry.get("embedding"))
            if embedding is None:
                raise InvalidInput(f"built-in voice {voice!r} has no speaker embedding in spk2info.pt")
            embedding = torch.as_tensor(embedding).float().reshape(-1)
            if "flow_prompt_speech_token" in entry:  # a saved zero-shot speaker carries its prompt
                flow_prompt = [int(t) for t in torch.as_tensor(entry["flow_prompt_speech_token"]).reshape(-1)]
                mel = (
                    torch.as_tensor(entry["prompt_speech_feat"])
                    .float()
                    .reshape(-1, 80)[: 2 * len(flow_prompt)]
                )
                llm_prompt = [
                    int(t) for t in torch.as_tensor(entry.get("llm_prompt_speech_token", [])).reshape(-1)
                ]
                if isinstance(entry.get("prompt_text"), torch.Tensor) and not instructions:
                    # its prompt text is stored as token ids (system prompt and <|endofprompt|> included)
                    prompt_ids = [int(t) for t in entry["prompt_text"].reshape(-1)]
        system = DEFAULT_SYSTEM + (
            f" {instructions.strip()}" if instructions and instructions.strip() else ""
        )
        if instructions:
            llm_prompt = []  # instructions replace the reference speech as the llm's prompt
        prompt_text = (
            reference_text
            if (reference_text and ENDOFPROMPT in reference_text)
            else (
                f"{system}{ENDOFPROMPT}{normalize_text(reference_text) if (reference_text and llm_prompt) else ''}"
            )
        )
        target = self.tokenizer.encode(normalize_text(text))
        if not target:
            raise InvalidInput("text has no speakable content")
        return Prepared(
            text_ids=(prompt_ids if prompt_ids is not None else self.tokenizer.encode(prompt_text)) + target,
            target_text_len=len(target),
            llm_prompt_tokens=llm_prompt,
            flow_prompt_tokens=flow_prompt,
            prompt_mel=mel,
            embedding=embedding,
        )


def parse_speed(value: Any) -> float:
    if value is None:
        return 1.0
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not SPEED_RANGE[0] <= float(value) <= SPEED_RANGE[1]
    ):
        raise InvalidInput(f"speed must be a number in [{SPEED_RANGE[0]}, {SPEED_RANGE[1]}], got {value!r}")
    return float(value)
