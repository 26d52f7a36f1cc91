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
from .codec_layers import WindowCache, kept_positions

# frames of latents decoded again before each chunk: the upsamplings' and the decoder's causal
# convolutions reach about 6 frames back at the official strides and kernels (6 decode exactly, 4 do not)
DEFAULT_LEFT_CONTEXT = 8


class CodecStream:
    def __init__(self, codec: Codec, left_context: int = DEFAULT_LEFT_CONTEXT):
        self.codec = codec
        self.left_context = left_context
        self.cache = WindowCache()
        self.latents: torch.Tensor | None = None  # [1, D, <= left_context]: the frames before the next chunk

    def shape_key(self, frames: int) -> tuple[int, int, int]:
        """Streams whose next ``frames`` have equal keys decode in one batch (``decode_together``)."""
        return frames, kept_positions(self.cache), 0 if self.latents is None else self.latents.shape[-1]

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """The next frames' codes [num_codebooks, n] -> their samples [n * hop]."""
        return decode_together([self], [codes])[0]


@torch.inference_mode()
def decode_together(streams: list[CodecStream], codes: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each stream's next frames [num_codebooks, n] -> its samples [n * hop], in one batch; the
    streams' ``shape_key(n)`` must be equal."""
    n = codes[0].shape[-1]
    if len({s.shape_key(c.shape[-1]) for s, c in zip(streams, codes, strict=True)}) != 1:
        raise ValueError("streams decoded together need equal chunks, kept positions and context")
    codec = streams[0].codec
    if n == 0:
        return [torch.zeros(0) for _ in streams]
    latents = codec.quantizer.latents(torch.stack(codes), [s.cache for s in streams])
    if streams[0].latents is not None:
        latents = torch.cat([torch.cat([s.latents for s in streams]), latents], dim=-1)
    audio = codec.upsampled(latents)[:, -n * codec.hop :]
    keep = latents.shape[-1] - min(streams[0].left_context, latents.shape[-1])
    for row, stream in enumerate(streams):
        stream.latents = latents[row : row + 1, :, keep:]
    return list(audio)
