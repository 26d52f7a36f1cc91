"""Short-time Fourier transforms for the vocoder's tiny frames (n_fft 16) as strided convolutions.

They compute what ``torch.stft`` / ``torch.istft`` with ``center=True`` and a Hann window do,
with two differences that batching needs: each row has its own length (the right-edge reflection
and the overlap-add normalisation use that row's end, so right padding cannot reach its samples),
and they never synchronise with the host (``torch.istft`` checks its window envelope on the
host), so they can run inside a CUDA graph. At 16 points a matmul-shaped DFT is also cheaper
than an FFT.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class FrameSTFT(nn.Module):
    def __init__(self, n_fft: int, hop: int):
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        # float32 buffers; forward casts them back should the module be cast to a lower precision
        window = torch.hann_window(n_fft, periodic=True, dtype=torch.float64)
        bins = n_fft // 2 + 1
        angle = 2 * math.pi * torch.outer(torch.arange(bins), torch.arange(n_fft)).double() / n_fft
        analysis = torch.cat([window * angle.cos(), -window * angle.sin()])  # [re | im, n_fft]
        # inverse real DFT: bins 1..n/2-1 stand for their conjugate twins too
        weight = torch.full((bins, 1), 2.0, dtype=torch.float64)
        weight[0] = 1
        if n_fft % 2 == 0:
            weight[-1] = 1
        synthesis = torch.cat([weight * angle.cos(), -weight * angle.sin()]) * window / n_fft
        self.register_buffer("analysis", analysis[:, None].float(), persistent=False)
        self.register_buffer("synthesis", synthesis[:, None].float(), persistent=False)
        self.register_buffer("window_sq", (window**2)[None, None].float(), persistent=False)

    def frames(self, samples: int) -> int:
        return samples // self.hop + 1

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, N] float32 -> [B, 2 * bins, N // hop + 1] (real parts, then imaginary parts).
        ``lengths`` [B] (samples): each row is reflected at its own end, not at N."""
        pad = self.n_fft // 2
        if lengths is None:
            padded = F.pad(x[:, None], (pad, pad), mode="reflect")[:, 0]
        else:
            padded = F.pad(x, (pad, pad))
            padded[:, :pad] = x[:, 1 : pad + 1].flip(-1)
            k = torch.arange(pad, device=x.device)
            ends = lengths.to(x.device).long()[:, None]
            padded.scatter_(1, ends + pad + k, x.gather(1, (ends - 2 - k).clamp(min=0)))
        return F.conv1d(padded[:, None].float(), self.analysis.float(), stride=self.hop)

    def inverse(self, spec: torch.Tensor, frame_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """[B, 2 * bins, L] -> [B, hop * (L - 1)]; ``frame_lengths`` [B]: a row's frames past its
        length take no part, so its first ``hop * (length - 1)`` samples are as if it ended there."""
        b, _, n = spec.shape
        if frame_lengths is None:
            mask = torch.ones(b, 1, n, device=spec.device)
        else:
            mask = (torch.arange(n, device=spec.device) < frame_lengths.to(spec.device)[:, None])[:, None]
            mask = mask.float()
            spec = spec * mask
        signal = F.conv_transpose1d(spec.float(), self.synthesis.float(), stride=self.hop)
        envelope = F.conv_transpose1d(mask, self.window_sq.float(), stride=self.hop)
        signal = torch.where(envelope > 1e-11, signal / envelope.clamp(min=1e-11), 0.0)
        pad = self.n_fft // 2
        return signal[:, 0, pad : pad + self.hop * (n - 1)]
