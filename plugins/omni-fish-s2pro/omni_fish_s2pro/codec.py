"""S2-Pro's codec (codec.pth): 44.1 kHz audio <-> frames of ``1 + n_codebooks`` codes, one frame
per 2048 samples (~21.5 Hz) at the official sizes.

Encoder: causal convolutions down to 86 Hz (a windowed transformer in its last block), then
the quantizer halves the rate twice (strided convolutions + ConvNeXt), runs ``pre_module`` (a
windowed transformer) and quantizes: a semantic codebook first, then residual codebooks on what
it leaves. Each codebook compares L2-normalised projections (``in_proj``) with its normalised
entries. Decoder: the codes' entries projected back (``out_proj``) and summed, ``post_module``,
the two upsamplings, then causal transposed convolutions up to 44.1 kHz and tanh.

The official sizes are the reference's (modded_dac_vq.yaml); codec.pth does not record them, so
``CodecSizes.of_state`` reads them off the tensors' shapes (the tiny preset's are smaller).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .codec_layers import (
    CausalConv1d,
    CausalConvTranspose1d,
    ConvNeXtBlock,
    ResidualUnit,
    Snake1d,
    WindowCache,
    WindowTransformer,
)

ENCODER_WINDOW = 512  # positions the encoder's transformer attends to
QUANTIZER_WINDOW = 128  # pre_module's and post_module's


@dataclass(frozen=True)
class CodecSizes:
    encoder_dim: int = 64
    encoder_rates: tuple[int, ...] = (2, 4, 8, 8)
    encoder_transformer_layers: tuple[int, ...] = (0, 0, 0, 4)
    latent_dim: int = 1024
    decoder_dim: int = 1536
    decoder_rates: tuple[int, ...] = (8, 8, 4, 2)
    downsample: tuple[int, ...] = (2, 2)
    module_layers: int = 8  # pre_module's and post_module's
    module_hidden: int = 3072
    semantic_codebook_size: int = 4096
    n_codebooks: int = 9  # residual codebooks
    codebook_size: int = 1024
    codebook_dim: int = 8

    @property
    def hop(self) -> int:
        """Samples per frame of codes."""
        return math.prod(self.encoder_rates) * math.prod(self.downsample)

    @classmethod
    def of_state(cls, state: dict[str, torch.Tensor]) -> CodecSizes:
        """The sizes a codec.pth state (weight norm folded, ``codec_checkpoint``) was made with."""

        def count(pattern: str) -> int:
            found = {int(m.group(1)) for k in state if (m := re.match(pattern, k))}
            return max(found) + 1 if found else 0

        blocks = count(r"encoder\.block\.(\d+)\.") - 3  # first conv, blocks, snake, last conv
        rates = tuple(
            state[f"encoder.block.{i}.block.4.conv.weight"].shape[-1] // 2 for i in range(1, blocks + 1)
        )
        layers = tuple(
            count(rf"encoder\.block\.{i}\.block\.5\.layers\.(\d+)\.") for i in range(1, blocks + 1)
        )
        ups = (
            count(r"decoder\.model\.(\d+)\.") - 3
        )  # first conv, blocks, snake, last conv (tanh has no tensors)
        return cls(
            encoder_dim=state["encoder.block.0.conv.weight"].shape[0],
            encoder_rates=rates,
            encoder_transformer_layers=layers,
            latent_dim=state[f"encoder.block.{blocks + 2}.conv.weight"].shape[0],
            decoder_dim=state["decoder.model.0.conv.weight"].shape[0],
            decoder_rates=tuple(
                state[f"decoder.model.{i}.block.1.conv.weight"].shape[-1] // 2 for i in range(1, ups + 1)
            ),
            downsample=tuple(
                state[f"quantizer.downsample.{i}.0.conv.weight"].shape[-1]
                for i in range(count(r"quantizer\.downsample\.(\d+)\."))
            ),
            module_layers=count(r"quantizer\.post_module\.layers\.(\d+)\."),
            module_hidden=state["quantizer.post_module.layers.0.feed_forward.w1.weight"].shape[0],
            semantic_codebook_size=state["quantizer.semantic_quantizer.quantizers.0.codebook.weight"].shape[
                0
            ],
            n_codebooks=count(r"quantizer\.quantizer\.quantizers\.(\d+)\."),
            codebook_size=state["quantizer.quantizer.quantizers.0.codebook.weight"].shape[0],
            codebook_dim=state["quantizer.quantizer.quantizers.0.codebook.weight"].shape[1],
        )


class EncoderBlock(nn.Module):
    def __init__(self, dim: int, stride: int, transformer_layers: int):
        super().__init__()
        half = dim // 2
        parts = [
            ResidualUnit(half, 1),
            ResidualUnit(half, 3),
            ResidualUnit(half, 9),
            Snake1d(half),
            CausalConv1d(half, dim, 2 * stride, stride=stride),
        ]
        if transformer_layers:
            parts.append(WindowTransformer(dim, transformer_layers, 3 * dim, ENCODER_WINDOW))
        self.block = nn.Sequential(*parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class Encoder(nn.Module):
    def __init__(self, s: CodecSizes):
        super().__init__()
        dim = s.encoder_dim
        blocks: list[nn.Module] = [CausalConv1d(1, dim, 7)]
        for stride, layers in zip(s.encoder_rates, s.encoder_transformer_layers, strict=True):
            dim *= 2
            blocks.append(EncoderBlock(dim, stride, layers))
        blocks += [Snake1d(dim), CausalConv1d(dim, s.latent_dim, 3)]
        self.block = nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(cin),
            CausalConvTranspose1d(cin, cout, 2 * stride, stride),
            ResidualUnit(cout, 1),
            ResidualUnit(cout, 3),
            ResidualUnit(cout, 9),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class Decoder(nn.Module):
    def __init__(self, s: CodecSizes):
        super().__init__()
        layers: list[nn.Module] = [CausalConv1d(s.latent_dim, s.decoder_dim, 7)]
        for i, stride in enumerate(s.decoder_rates):
            layers.append(DecoderBlock(s.decoder_dim // 2**i, s.decoder_dim // 2 ** (i + 1), stride))
        out = s.decoder_dim // 2 ** len(s.decoder_rates)
        layers += [Snake1d(out), CausalConv1d(out, 1, 7), nn.Tanh()]
        self.model = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class Codebook(nn.Module):
    """One vector quantizer: ``in_proj`` to the codebook's space, nearest normalised entry, ``out_proj`` back."""

    def __init__(self, dim: int, size: int, codebook_dim: int):
        super().__init__()
        self.in_proj = nn.Conv1d(dim, codebook_dim, 1)
        self.out_proj = nn.Conv1d(codebook_dim, dim, 1)
        self.codebook = nn.Embedding(size, codebook_dim)

    def quantize(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """z [B, D, T] -> (codes [B, T], their decoded vectors [B, D, T])."""
        latents = F.normalize(self.in_proj(z).transpose(1, 2), dim=-1)
        codes = (latents @ F.normalize(self.codebook.weight, dim=-1).T).argmax(-1)
        return codes, self.decode(codes)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.codebook(codes).transpose(1, 2))


class Codebooks(nn.Module):
    def __init__(self, count: int, dim: int, size: int, codebook_dim: int):
        super().__init__()
        self.quantizers = nn.ModuleList(Codebook(dim, size, codebook_dim) for _ in range(count))


class Quantizer(nn.Module):
    def __init__(self, s: CodecSizes):
        super().__init__()
        d = s.latent_dim
        self.semantic_quantizer = Codebooks(1, d, s.semantic_codebook_size, s.codebook_dim)
        self.quantizer = Codebooks(s.n_codebooks, d, s.codebook_size, s.codebook_dim)
        self.downsample = nn.Sequential(
            *(
                nn.Sequential(CausalConv1d(d, d, f, stride=f, weight_norm=False), ConvNeXtBlock(d))
                for f in s.downsample
            )
        )
        self.upsample = nn.Sequential(
            *(
                nn.Sequential(CausalConvTranspose1d(d, d, f, f, weight_norm=False), ConvNeXtBlock(d))
                for f in reversed(s.downsample)
            )
        )
        self.pre_module = WindowTransformer(d, s.module_layers, s.module_hidden, QUANTIZER_WINDOW)
        self.post_module = WindowTransformer(d, s.module_layers, s.module_hidden, QUANTIZER_WINDOW)

    def encode(self, z: torch.Tensor) -> torch.Tensor:
        """The encoder's output [B, D, T] -> codes [B, 1 + n_codebooks, frames]."""
        z = self.pre_module(self.downsample(z))
        codes, semantic = self.semantic_quantizer.quantizers[0].quantize(z)
        out, residual = [codes], z - semantic
        for book in self.quantizer.quantizers:
            codes, decoded = book.quantize(residual)
            out.append(codes)
            residual = residual - decoded
        return torch.stack(out, dim=1)

    def latents(self, codes: torch.Tensor, caches: list[WindowCache] | None = None) -> torch.Tensor:
        """codes [B, 1 + n_codebooks, n] -> ``post_module``'s output [B, D, n] (``caches``: each row's stream)."""
        semantic = self.semantic_quantizer.quantizers[0]
        z = semantic.decode(codes[:, 0].clamp(max=semantic.codebook.num_embeddings - 1))
        for i, book in enumerate(self.quantizer.quantizers):
            z = z + book.decode(codes[:, i + 1].clamp(max=book.codebook.num_embeddings - 1))
        return self.post_module(z, caches)


class Codec(nn.Module):
    def __init__(self, s: CodecSizes, sample_rate: int = 44100):
        super().__init__()
        self.sizes, self.sample_rate, self.hop = s, sample_rate, s.hop
        self.encoder = Encoder(s)
        self.quantizer = Quantizer(s)
        self.decoder = Decoder(s)

    @property
    def num_codebooks(self) -> int:
        return 1 + self.sizes.n_codebooks

    @torch.inference_mode()
    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        """audio [B, T] at ``sample_rate`` -> codes [B, num_codebooks, ceil(T / hop)] (the last
        frame padded with silence)."""
        pad = -audio.shape[-1] % self.hop
        x = F.pad(audio, (0, pad))[:, None].to(self.decoder.model[0].conv.weight.dtype)
        return self.quantizer.encode(self.encoder(x))

    @torch.inference_mode()
    def upsampled(self, latents: torch.Tensor) -> torch.Tensor:
        """``post_module``'s output [B, D, n] -> audio [B, n * hop] (the convolutions only)."""
        return self.decoder(self.quantizer.upsample(latents))[:, 0]

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, num_codebooks, n] -> audio [B, n * hop], all at once."""
        return self.upsampled(self.quantizer.latents(codes))
