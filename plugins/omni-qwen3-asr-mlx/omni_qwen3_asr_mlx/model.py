"""Qwen3-ASR in MLX: encoder + projector + decoder, loaded from a checkpoint directory."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .config import ASRConfig, load_config
from .decoder import Decoder
from .encoder import AudioEncoder, Projector
from .weights import load_into, read_checkpoint

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


class ASRNetwork(nn.Module):
    def __init__(self, config: ASRConfig, tie_word_embeddings: bool):
        super().__init__()
        self.config = config
        self.audio_tower = AudioEncoder(config.encoder)
        self.projector = Projector(config.encoder)
        self.decoder = Decoder(config.decoder, tie_word_embeddings)

    def encode(self, mel: np.ndarray) -> mx.array:
        """[mel bins, frames] -> audio embeddings [tokens, decoder hidden]."""
        return self.projector(self.audio_tower(mel))

    def encode_many(self, mels: list[np.ndarray]) -> list[mx.array]:
        encoded = self.audio_tower.encode_many(mels)
        lengths = np.cumsum([0] + [e.shape[0] for e in encoded])
        projected = self.projector(mx.concatenate(encoded))  # one matrix product for all audios
        return [projected[int(a) : int(b)] for a, b in zip(lengths[:-1], lengths[1:], strict=True)]

    def prompt_embeddings(self, token_ids: list[int], audio: mx.array) -> mx.array:
        """Embed ``token_ids`` and put ``audio`` rows at the audio placeholder tokens: [1, n, hidden]."""
        ids = np.asarray(token_ids, dtype=np.int32)
        slots = np.flatnonzero(ids == self.config.audio_token_id)
        if len(slots) != audio.shape[0]:
            raise ValueError(f"prompt has {len(slots)} audio placeholders for {audio.shape[0]} audio tokens")
        text = self.decoder.embed_tokens(mx.array(ids))
        start, stop = int(slots[0]), int(slots[-1]) + 1
        if stop - start != len(slots):
            raise ValueError("audio placeholders must be contiguous")
        pieces = [text[:start], audio.astype(text.dtype), text[stop:]]
        return mx.concatenate(pieces)[None]


def default_dtype() -> str:
    return "float32" if mx.default_device() == mx.cpu else "bfloat16"


def load_network(checkpoint_dir: str, dtype: str | None = None) -> ASRNetwork:
    config = load_config(checkpoint_dir)
    name = dtype or default_dtype()
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {sorted(DTYPES)}")
    weights = read_checkpoint(checkpoint_dir)
    network = ASRNetwork(config, tie_word_embeddings="decoder.lm_head.weight" not in weights)
    load_into(network, config, weights, DTYPES[name])
    return network
