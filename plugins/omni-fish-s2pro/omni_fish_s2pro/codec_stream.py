"""One request's audio decoded frame chunk by frame chunk, equal to decoding all its frames at once.

``post_module`` (the windowed transformer) continues from the keys and values it kept
(``WindowCache``): exact. The convolutions after it (the two upsamplings and the decoder) have a
bounded reach into the past, so each chunk is decoded again together with the ``left_context``
frames of latents before it, and only the chunk's own samples are kept: exact once
``left_context`` covers that reach (``DEFAULT_LEFT_CONTEXT`` does at the official sizes).
"""

from __future__ import annotations

import torch

from .codec import Codec
from .codec_layers import WindowCache

# frames of latents decoded again before each chunk: the upsamplings' and the decoder's causal
# convolutions reach about 7 frames back at the official strides and kernels
DEFAULT_LEFT_CONTEXT = 8


class CodecStream:
    def __init__(self, codec: Codec, left_context: int = DEFAULT_LEFT_CONTEXT):
        self.codec = codec
        self.left_context = left_context
        self.cache = WindowCache()
        self.latents: torch.Tensor | None = None  # [1, D, <= left_context]: the frames before the next chunk

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """The next frames' codes [num_codebooks, n] -> their samples [n * hop]."""
        n = codes.shape[-1]
        if n == 0:
            return torch.zeros(0)
        latents = self.codec.quantizer.latents(codes[None], self.cache)
        window = latents if self.latents is None else torch.cat([self.latents, latents], dim=-1)
        audio = self.codec.upsampled(window)[0, -n * self.codec.hop :]
        self.latents = window[..., window.shape[-1] - min(self.left_context, window.shape[-1]) :]
        return audio
