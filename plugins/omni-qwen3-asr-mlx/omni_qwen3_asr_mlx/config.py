"""Model settings read from a checkpoint's config.json, in either published layout.

The original Qwen/Qwen3-ASR checkpoints nest everything under ``thinker_config``; the
transformers (``-hf``) layout has ``audio_config`` and ``text_config`` at the top. MLX conversions
add a ``quantization`` block (``group_size``, ``bits``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class EncoderConfig:
    num_mel_bins: int = 128
    layers: int = 24
    heads: int = 16
    ffn_dim: int = 4096
    d_model: int = 1024
    output_dim: int = 2048
    n_window: int = 50  # half the mel frames of one conv chunk
    n_window_infer: int = 800  # mel frames one attention window spans
    conv_channels: int = 480

    @property
    def chunk_frames(self) -> int:
        return 2 * self.n_window

    @property
    def tokens_per_full_chunk(self) -> int:
        return post_conv_length(self.chunk_frames)

    @property
    def window_tokens(self) -> int:
        return self.tokens_per_full_chunk * (self.n_window_infer // self.chunk_frames)


@dataclass(frozen=True)
class DecoderConfig:
    vocab_size: int = 151936
    hidden_size: int = 2048
    intermediate_size: int = 6144
    layers: int = 28
    heads: int = 16
    kv_heads: int = 8
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    tie_word_embeddings: bool = True


@dataclass(frozen=True)
class ASRConfig:
    encoder: EncoderConfig
    decoder: DecoderConfig
    audio_token_id: int = 151676
    eos_token_ids: tuple[int, ...] = (151643, 151645)
    quantization: dict[str, Any] | None = None
    layout: str = "hf"  # "hf" (transformers) or "original" (thinker.*)
    extra: dict[str, Any] = field(default_factory=dict)


def post_conv_length(frames: int) -> int:
    """Tokens left from ``frames`` mel frames after three 3x3 stride-2 convolutions (padding 1)."""
    for _ in range(3):
        frames = (frames - 1) // 2 + 1 if frames > 0 else 0
    return frames


def audio_token_count(frames: int, n_window: int = 50) -> int:
    """Encoder tokens for ``frames`` mel frames cut into chunks of ``2 * n_window``."""
    chunk = 2 * n_window
    full, rest = divmod(frames, chunk)
    return full * post_conv_length(chunk) + post_conv_length(rest)


def _encoder_config(raw: dict[str, Any]) -> EncoderConfig:
    return EncoderConfig(
        num_mel_bins=raw.get("num_mel_bins", 128),
        layers=raw.get("encoder_layers", 24),
        heads=raw.get("encoder_attention_heads", 16),
        ffn_dim=raw.get("encoder_ffn_dim", 4096),
        d_model=raw.get("d_model", 1024),
        output_dim=raw.get("output_dim", 2048),
        n_window=raw.get("n_window", 50),
        n_window_infer=raw.get("n_window_infer", 800),
        conv_channels=raw.get("downsample_hidden_size", 480),
    )


def _decoder_config(raw: dict[str, Any], tie_default: bool) -> DecoderConfig:
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    theta = rope.get("rope_theta", raw.get("rope_theta", 1_000_000.0))
    hidden = raw.get("hidden_size", 2048)
    heads = raw.get("num_attention_heads", 16)
    return DecoderConfig(
        vocab_size=raw.get("vocab_size", 151936),
        hidden_size=hidden,
        intermediate_size=raw.get("intermediate_size", 6144),
        layers=raw.get("num_hidden_layers", 28),
        heads=heads,
        kv_heads=raw.get("num_key_value_heads", 8),
        head_dim=raw.get("head_dim") or hidden // heads,
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=float(theta),
        tie_word_embeddings=raw.get("tie_word_embeddings", tie_default),
    )


def load_config(checkpoint_dir: str) -> ASRConfig:
    path = os.path.join(checkpoint_dir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{checkpoint_dir} has no config.json: not a Qwen3-ASR checkpoint")
    with open(path) as f:
        raw = json.load(f)
    layout = "original" if "thinker_config" in raw else "hf"
    body = raw.get("thinker_config", raw)
    if "audio_config" not in body or "text_config" not in body:
        raise ValueError(
            f"{path}: expected audio_config and text_config (at the top or under thinker_config); "
            f"found keys {sorted(body)}"
        )
    eos = raw.get("eos_token_id", body.get("eos_token_id", (151643, 151645)))
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
    tie_default = bool(raw.get("tie_word_embeddings", False))
    return ASRConfig(
        encoder=_encoder_config(body["audio_config"]),
        decoder=_decoder_config(body["text_config"], tie_default),
        audio_token_id=body.get("audio_token_id", body.get("audio_token_index", 151676)),
        eos_token_ids=eos_ids,
        quantization=raw.get("quantization") or raw.get("quantization_config"),
        layout=layout,
        extra={"model_type": raw.get("model_type")},
    )
