"""What a Qwen3-Omni checkpoint says about itself: the thinker's configs (text, audio, vision),
its special token ids, and the preprocessing settings.

Every id comes from the checkpoint (config.json, then the tokenizer for ids a config leaves
out), never from constants: a checkpoint whose ids differ from Qwen's works the same.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

# In place of safetensors (the `full` preset): each stage draws its weights on its device as it loads
RANDOM_WEIGHTS = "random_weights.json"


class CheckpointError(ValueError):
    """A directory that is not a Qwen3-Omni checkpoint: the message says what is missing."""


@dataclass(frozen=True)
class TokenIds:
    audio: int  # <|audio_pad|>: one per audio embedding row
    image: int  # <|image_pad|>
    video: int  # <|video_pad|>
    audio_start: int
    audio_end: int
    vision_start: int
    vision_end: int
    eos: tuple[int, ...]  # the reply ends at any of these


@dataclass(frozen=True)
class AudioSettings:
    """Whisper-style log-mel features (preprocessor_config.json)."""

    sampling_rate: int = 16000
    n_mels: int = 128
    n_fft: int = 400
    hop_length: int = 160
    max_samples: int = 4_800_000  # n_samples: 300 s


@dataclass(frozen=True)
class VisionSettings:
    """Qwen2-VL image processing (preprocessor_config.json) and the video settings of Qwen3-Omni's processor."""

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 3136
    max_pixels: int = 12_845_056
    image_mean: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
    image_std: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)
    video_min_pixels: int = 128 * 32 * 32
    video_max_pixels: int = 768 * 32 * 32


@dataclass(frozen=True)
class OmniCheckpoint:
    path: str
    config: Any  # transformers' Qwen3OmniMoeConfig (or, for a thinker-only checkpoint, its thinker config)
    tokens: TokenIds
    audio: AudioSettings
    vision: VisionSettings
    position_id_per_seconds: float
    chat_template: str
    random_weights_std: float | None = None  # weights drawn at load with this deviation, not read (RANDOM_WEIGHTS)

    @property
    def thinker(self):
        return getattr(self.config, "thinker_config", self.config)

    def speech_config(self, name: str):
        """``talker_config`` or ``code2wav_config``: the speech half's, which a thinker-only checkpoint lacks."""
        part = getattr(self.config, name, None)
        if part is None:
            raise CheckpointError(f"{self.path} has no {name} (a thinker-only checkpoint: no speech out)")
        return part

    @property
    def text_config(self):
        return self.thinker.text_config

    @property
    def audio_config(self):
        return self.thinker.audio_config

    @property
    def vision_config(self):
        return self.thinker.vision_config


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}


@lru_cache(maxsize=8)
def load_checkpoint(checkpoint_dir: str) -> OmniCheckpoint:
    root = Path(checkpoint_dir)
    raw = _read_json(root / "config.json")
    if raw.get("model_type") not in ("qwen3_omni_moe", "qwen3_omni_moe_thinker"):
        raise CheckpointError(
            f"{root} is not a Qwen3-Omni checkpoint: config.json model_type is {raw.get('model_type')!r}, "
            "expected 'qwen3_omni_moe'"
        )
    from transformers import AutoConfig

    with quiet_transformers():
        config = AutoConfig.from_pretrained(str(root))
    thinker = getattr(config, "thinker_config", config)
    raw_thinker = raw.get("thinker_config", raw)
    tokenizer = load_tokenizer(checkpoint_dir)
    tokens = TokenIds(
        audio=int(thinker.audio_token_id),
        image=int(thinker.image_token_id),
        video=int(thinker.video_token_id),
        audio_start=int(thinker.audio_start_token_id),
        audio_end=_token_id(raw_thinker, "audio_end_token_id", tokenizer, "<|audio_end|>"),
        vision_start=_token_id(raw_thinker, "vision_start_token_id", tokenizer, "<|vision_start|>"),
        vision_end=_token_id(raw_thinker, "vision_end_token_id", tokenizer, "<|vision_end|>"),
        eos=_eos_ids(root, raw, tokenizer),
    )
    return OmniCheckpoint(
        path=str(root),
        config=config,
        tokens=tokens,
        audio=_audio_settings(root),
        vision=_vision_settings(root),
        position_id_per_seconds=float(raw_thinker.get("position_id_per_seconds", thinker.position_id_per_seconds)),
        chat_template=load_chat_template(root, tokenizer),
        random_weights_std=float(_read_json(root / RANDOM_WEIGHTS).get("std", 0.02)) if (root / RANDOM_WEIGHTS).exists() else None,
    )


@lru_cache(maxsize=8)
def load_tokenizer(checkpoint_dir: str):
    from transformers import AutoTokenizer

    with quiet_transformers():  # it reads config.json too
        return AutoTokenizer.from_pretrained(checkpoint_dir)


@contextlib.contextmanager
def quiet_transformers():
    """transformers warns that rope_parameters' M-RoPE keys are not its own whenever it reads a
    Qwen3-Omni config.json (the real checkpoint's included): a warning no user can act on; and
    the preset's shard writing needs no progress bar."""
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _token_id(raw: dict, key: str, tokenizer, token: str) -> int:
    if raw.get(key) is not None:
        return int(raw[key])
    value = tokenizer.convert_tokens_to_ids(token)
    if value is None or value == tokenizer.unk_token_id:
        raise CheckpointError(f"the checkpoint names no {key} and its tokenizer has no {token}")
    return int(value)


def _eos_ids(root: Path, raw: dict, tokenizer) -> tuple[int, ...]:
    value = _read_json(root / "generation_config.json").get("eos_token_id")
    if value is None:
        value = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = value if isinstance(value, list) else [value]
    return tuple(int(i) for i in ids if i is not None)


def _audio_settings(root: Path) -> AudioSettings:
    raw = _read_json(root / "preprocessor_config.json")
    defaults = AudioSettings()
    return AudioSettings(
        sampling_rate=int(raw.get("sampling_rate", defaults.sampling_rate)),
        n_mels=int(raw.get("feature_size", defaults.n_mels)),
        n_fft=int(raw.get("n_fft", defaults.n_fft)),
        hop_length=int(raw.get("hop_length", defaults.hop_length)),
        max_samples=int(raw.get("n_samples", defaults.max_samples)),
    )


def _vision_settings(root: Path) -> VisionSettings:
    raw = _read_json(root / "preprocessor_config.json")
    d = VisionSettings()
    size = raw.get("size") or {}
    return VisionSettings(
        patch_size=int(raw.get("patch_size", d.patch_size)),
        temporal_patch_size=int(raw.get("temporal_patch_size", d.temporal_patch_size)),
        merge_size=int(raw.get("merge_size", d.merge_size)),
        min_pixels=int(raw.get("min_pixels", size.get("shortest_edge", d.min_pixels))),
        max_pixels=int(raw.get("max_pixels", size.get("longest_edge", d.max_pixels))),
        image_mean=tuple(raw.get("image_mean", d.image_mean)),
        image_std=tuple(raw.get("image_std", d.image_std)),
    )


def load_chat_template(root: Path, tokenizer) -> str:
    """The checkpoint's own template: chat_template.jinja, chat_template.json, or the tokenizer's."""
    jinja = root / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text(encoding="utf-8")
    template = _read_json(root / "chat_template.json").get("chat_template")
    if template:
        return template
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise CheckpointError(f"{root} has no chat template (chat_template.jinja, chat_template.json or tokenizer_config.json)")
    return template
