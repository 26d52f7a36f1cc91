"""HiFT vocoder: causal NSF-HiFiGAN with an iSTFT head, 80-bin mel at 50 Hz -> 24 kHz.

Names follow the official ``hift.pt``; weight-normed convolutions use torch parametrizations, so
their tensors are ``parametrizations.weight.original0`` (g) and ``original1`` (v) as saved
there. Every convolution is causal except ``conv_pre`` and the F0 predictor's first layer,
which look ``conv_pre_look_right`` and 3 frames ahead: a non-final chunk's last frames wait for
the next chunk (``HiftGenerator.stable_samples``).

A stream is vocoded in windows (``HiftWindow``): a call starts ``WINDOW_CONTEXT`` frames before
the first sample it sends instead of at the utterance's start, so a request's vocoder work grows
with its length, not its square. Every convolution reaches a bounded distance to the left, but
the excitation's phase is the sum of every earlier frame's pitch: each call returns that sum at
the point the next call's window trusts its own pitch from (``F0_CONTEXT`` frames in), and the
next call continues from it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from omni_core.scheduler.host_copy import to_device
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from .config import HiftConfig
from .graph_buckets import GraphBuckets
from .stft import FrameSTFT

log = logging.getLogger(__name__)

NOISE_SECONDS = 20  # length of the fixed excitation-noise table, cycled for longer audio
# frames of mel left of a frame that its pitch depends on (the F0 predictor's four causal convs of 3)
F0_CONTEXT = 8
# frames a window starts before the first sample it sends: past the reach of its first
# F0_CONTEXT frames (whose pitch it cannot know) through the source's down-convolution and
# residual blocks (~26 frames more), and of the mel through the decoder (~24)
WINDOW_CONTEXT = 40


@dataclass
class HiftWindow:
    """One row of a windowed call: the mel from absolute frame ``start`` on, the excitation phase
    carried from the call before (``SourceModule`` below; None at the start), and ``carry_at``, the
    frame (relative to ``start``) at which to return the phase for the next call."""

    mel: torch.Tensor  # [80, frames]
    start: int = 0
    phase: torch.Tensor | None = None  # [nb_harmonics + 1] float64
    carry_at: int = 0


def pitch_known_from(start: int) -> int:
    """The first absolute frame whose pitch a window starting at ``start`` knows (sees all the
    mel it depends on): where the phase carried into that window counts from."""
    return start + F0_CONTEXT if start > 0 else 0


class CausalConv1d(nn.Conv1d):
    """Stride-1 conv padded on the left ('left', causal) or right ('right', lookahead) only."""

    def __init__(self, cin, cout, kernel_size, dilation=1, causal_type="left"):
        super().__init__(cin, cout, kernel_size, dilation=dilation)
        self.pad = (kernel_size - 1) * dilation
        self.causal_type = causal_type

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = (self.pad, 0) if self.causal_type == "left" else (0, self.pad)
        return super().forward(F.pad(x, pad))


class CausalUpsample(nn.Conv1d):
    def __init__(self, cin, cout, kernel_size, stride):
        super().__init__(cin, cout, kernel_size)
        self.stride_up = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, scale_factor=self.stride_up, mode="nearest")
        return super().forward(F.pad(x, (self.kernel_size[0] - 1, 0)))


class CausalDownsample(nn.Conv1d):
    def __init__(self, cin, cout, kernel_size, stride):
        super().__init__(cin, cout, kernel_size, stride=stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (self.stride[0] - 1, 0)))


class Snake(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.alpha[None, :, None]
        return x + (1.0 / (a + 1e-9)) * torch.sin(x * a).pow(2)


class ResBlock(nn.Module):
    def __init__(self, channels: int, kernel_size: int, dilations: list[int]):
        super().__init__()
        self.convs1 = nn.ModuleList(
            weight_norm(CausalConv1d(channels, channels, kernel_size, d)) for d in dilations
        )
        self.convs2 = nn.ModuleList(
            weight_norm(CausalConv1d(channels, channels, kernel_size, 1)) for _ in dilations
        )
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c1, c2, a1, a2 in zip(
            self.convs1, self.convs2, self.activations1, self.activations2, strict=True
        ):
            x = x + c2(a2(c1(a1(x))))
        return x


class F0Predictor(nn.Module):
    """Mel -> F0 in Hz per frame; the first conv looks 3 frames ahead."""

    def __init__(self, in_channels: int, cond_channels: int):
        super().__init__()
        layers: list[nn.Module] = [
            weight_norm(CausalConv1d(in_channels, cond_channels, 4, causal_type="right")),
            nn.ELU(),
        ]
        for _ in range(4):
            layers += [weight_norm(CausalConv1d(cond_channels, cond_channels, 3)), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(cond_channels, 1)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.condnet(mel).transpose(1, 2)).squeeze(-1).abs()


def _hold(x: torch.Tensor, times: int) -> torch.Tensor:
    """[B, F, C] -> [B, F * times, C], each frame repeated (an expand: capturable in a CUDA graph)."""
    b, f, c = x.shape
    return x[:, :, None].expand(b, f, times, c).reshape(b, f * times, c)


class SourceModule(nn.Module):
    """Harmonic sine excitation from F0 merged into one channel (neural source filter)."""

    def __init__(self, cfg: HiftConfig):
        super().__init__()
        self.cfg = cfg
        self.l_linear = nn.Linear(cfg.nb_harmonics + 1, 1)
        gen = torch.Generator().manual_seed(0)
        table = torch.rand(NOISE_SECONDS * cfg.sampling_rate, cfg.nb_harmonics + 1, generator=gen)
        self.register_buffer("noise_table", table, persistent=False)

    def forward(
        self,
        f0: torch.Tensor,
        start: torch.Tensor | None = None,
        phase: torch.Tensor | None = None,
        trusted: torch.Tensor | None = None,
        carry_at: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """f0 [B, frames] -> excitation [B, 1, frames * samples_per_frame], and the phase to carry.

        A window (``HiftWindow``) starts at frame ``start`` [B]; its pitch is trusted from frame
        ``trusted`` [B] on, where the phase goes on from ``phase`` [B, harmonics] (the sum of
        every earlier frame's, wrapped to a cycle); before it the excitation is the context a
        window discards. Returns the wrapped sum over the frames before ``carry_at`` [B]."""
        cfg, up = self.cfg, self.cfg.samples_per_frame
        f0 = f0.double()
        b, frames = f0.shape
        harmonics = torch.arange(1, cfg.nb_harmonics + 2, device=f0.device, dtype=f0.dtype)
        rad = (f0[:, :, None] * harmonics / cfg.sampling_rate) % 1  # cycles per sample, per frame
        if trusted is not None:
            rad = rad * (torch.arange(frames, device=f0.device)[None, :] >= trusted[:, None])[:, :, None]
        # phase advances a frame's worth at a time and is held within the frame (causal NSF);
        # summed in float64 and wrapped to one cycle: in float32 the sum of 20 s of voiced audio
        # drifts the waveform by ~3e-4
        summed = torch.cumsum(rad, dim=1)
        if phase is not None:
            summed = summed + phase[:, None, :]
        sines = _hold(torch.sin(2 * torch.pi * ((summed * up) % 1)).float(), up) * cfg.nsf_alpha
        voiced = _hold((f0 > cfg.nsf_voiced_threshold).float()[:, :, None], up)
        n = sines.shape[1]
        idx = torch.arange(n, device=f0.device)
        idx = (idx if start is None else start[:, None] * up + idx) % self.noise_table.shape[0]
        noise_amp = voiced * cfg.nsf_sigma + (1 - voiced) * cfg.nsf_alpha / 3
        excitation = sines * voiced + noise_amp * self.noise_table[idx].float()
        merged = torch.tanh(self.l_linear(excitation.to(self.l_linear.weight.dtype)))
        # the sum before frame k is the running sum's entry k - 1 (the carried phase for k = 0)
        before = torch.cat([summed.new_zeros(b, 1, summed.shape[2]) if phase is None else phase[:, None], summed], 1)
        at = torch.zeros(b, dtype=torch.long, device=f0.device) if carry_at is None else carry_at
        carry = before.gather(1, at[:, None, None].expand(-1, 1, summed.shape[2]))[:, 0] % 1
        return merged.float().transpose(1, 2), carry


class HiftGenerator(nn.Module):
    def __init__(self, cfg: HiftConfig):
        super().__init__()
        self.cfg = cfg
        base, n_fft = cfg.base_channels, cfg.n_fft
        self.m_source = SourceModule(cfg)
        self.f0_predictor = F0Predictor(cfg.in_channels, cfg.f0_cond_channels).double()  # float64, as the reference
        self.conv_pre = weight_norm(
            CausalConv1d(cfg.in_channels, base, cfg.conv_pre_look_right + 1, causal_type="right")
        )
        self.ups = nn.ModuleList(
            weight_norm(CausalUpsample(base // 2**i, base // 2 ** (i + 1), k, u))
            for i, (u, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes, strict=True))
        )
        down_rates = [1] + cfg.upsample_rates[::-1][:-1]
        cum = [1]
        for r in down_rates[1:]:
            cum.append(cum[-1] * r)
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        for i, (u, k, d) in enumerate(
            zip(cum[::-1], cfg.source_resblock_kernel_sizes, cfg.source_resblock_dilation_sizes, strict=True)
        ):
            ch = base // 2 ** (i + 1)
            down = CausalConv1d(n_fft + 2, ch, 1) if u == 1 else CausalDownsample(n_fft + 2, ch, u * 2, u)
            self.source_downs.append(down)
            self.source_resblocks.append(ResBlock(ch, k, d))
        self.resblocks = nn.ModuleList()
        for i in range(len(self.ups)):
            ch = base // 2 ** (i + 1)
            for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes, strict=True):
                self.resblocks.append(ResBlock(ch, k, d))
        self.conv_post = weight_norm(CausalConv1d(ch, n_fft + 2, 7))
        self.stft = FrameSTFT(n_fft, cfg.hop_len)
        self.graphs: GraphBuckets | None = None  # CUDA graphs per batch bucket (use_graphs)

    def _apply(self, fn, recurse=True):
        # any cast (``.to(dtype)``, ``.half()``) leaves the F0 predictor in float64
        super()._apply(fn, recurse)
        self.f0_predictor.double()
        return self

    def stable_samples(self, frames: int, finalize: bool) -> int:
        """Samples of a ``frames``-long mel that later frames can no longer change."""
        if finalize:
            return frames * self.cfg.samples_per_frame
        held = 3 + self.cfg.conv_pre_look_right + 1  # F0 lookahead, conv_pre lookahead, iSTFT overlap
        return max(frames - held, 0) * self.cfg.samples_per_frame

    @torch.inference_mode()
    def forward(self, mel: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """mel [B, 80, T] (zeros past each row's end) -> audio [B, T * samples_per_frame] in
        [-limit, limit]. ``lengths`` [B] (frames): a row's samples up to its own end are as if it
        were alone and unpadded (everything is causal or reflects at the row's own end)."""
        return self.window(mel, lengths)[0]

    @torch.inference_mode()
    def window(
        self,
        mel: torch.Tensor,
        lengths: torch.Tensor | None = None,
        start: torch.Tensor | None = None,
        phase: torch.Tensor | None = None,
        carry_at: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` over windows of streams (``HiftWindow``; ``start``, ``phase``, ``carry_at``
        per row, None: the utterance's start): the audio, and the phase at ``carry_at``."""
        cfg = self.cfg
        trusted = None if start is None else (start > 0).long() * F0_CONTEXT
        # F0 and the phase it integrates in float64 whatever the model's dtype, as the reference:
        # a causal vocoder's pitch hangs on them
        f0 = self.f0_predictor(mel.double())
        source, carry = self.m_source(f0, start, phase, trusted, carry_at)
        source = source.squeeze(1)
        samples = None if lengths is None else lengths * cfg.samples_per_frame
        s_stft = self.stft(source, samples).to(self.conv_pre.weight.dtype)
        x = self.conv_pre(mel)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, cfg.lrelu_slope))
            if i == len(self.ups) - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + self.source_resblocks[i](self.source_downs[i](s_stft))
            n = len(cfg.resblock_kernel_sizes)
            x = sum(self.resblocks[i * n + j](x) for j in range(n)) / n
        x = self.conv_post(F.leaky_relu(x))
        half = cfg.n_fft // 2 + 1
        magnitude = torch.exp(x[:, :half].float()).clamp(max=1e2)
        angle = torch.sin(x[:, half:].float())
        spec = torch.cat([magnitude * torch.cos(angle), magnitude * torch.sin(angle)], dim=1)
        frames = None if samples is None else self.stft.frames(samples)
        audio = self.stft.inverse(spec, frames)
        return audio.clamp(-cfg.audio_limit, cfg.audio_limit), carry

    def packed(self, mel, lengths, start, phase, carry_at) -> torch.Tensor:
        """``window``'s audio and carried phase as one float32 tensor (a graph's one output); the
        phase's float64 bits ride as pairs of float32."""
        audio, carry = self.window(mel, lengths, start, phase, carry_at)
        return torch.cat([audio.float(), carry.contiguous().view(torch.float32)], dim=1)

    @torch.inference_mode()
    def infer(self, mels: list[torch.Tensor]) -> list[torch.Tensor]:
        """Per-request mel [80, T_i] (any device) -> float32 audio [T_i * samples_per_frame] on the
        model's device, batched (one padded call; through a CUDA graph when ``use_graphs`` ran)."""
        return [audio for audio, _ in self.infer_windows([HiftWindow(m) for m in mels])]

    @torch.inference_mode()
    def infer_windows(self, windows: list[HiftWindow]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``infer`` over windows of streams: per row its window's audio and the phase at its
        ``carry_at`` (float64 [harmonics], on the device) for the row's next window."""
        device, dtype = self.conv_post.weight.device, self.conv_post.weight.dtype
        lengths = [int(w.mel.shape[1]) for w in windows]
        if log.isEnabledFor(logging.DEBUG):  # what each call computes, for `--log-level debug`
            log.debug("hift: %d rows, %d frames (largest %d)", len(windows), sum(lengths), max(lengths))
        batch = torch.zeros(len(windows), self.cfg.in_channels, max(lengths))
        for i, w in enumerate(windows):
            batch[i, :, : lengths[i]] = w.mel.float()
        harmonics = self.cfg.nb_harmonics + 1
        zero = torch.zeros(harmonics, dtype=torch.float64, device=device)
        # each row's integers in one copy
        lens, start, carry_at = to_device(torch.tensor([lengths, [w.start for w in windows], [w.carry_at for w in windows]]), device)
        inputs = {
            "mel": to_device(batch, device).to(dtype),
            "lengths": lens,
            "start": start,
            "phase": torch.stack([zero if w.phase is None else w.phase.to(device) for w in windows]),
            "carry_at": carry_at,
        }
        packed = None
        if self.graphs is not None:
            packed = self.graphs.run(inputs, len(windows), max(lengths))
        if packed is None:
            packed = self.packed(**inputs)
        audio, carry = packed[:, : -2 * harmonics], packed[:, -2 * harmonics :].contiguous().view(torch.float64)
        per_frame = self.cfg.samples_per_frame
        return [(audio[i, : n * per_frame], carry[i]) for i, n in enumerate(lengths)]

    def use_graphs(
        self,
        batches: tuple[int, ...],
        frames: tuple[int, ...],
        warm: list[tuple[int, int]] = (),
        max_work: int | None = None,
    ) -> GraphBuckets:
        """Run ``infer``'s batches as CUDA graphs per (batch, frames) bucket."""
        device, dtype = self.conv_post.weight.device, self.conv_post.weight.dtype
        if device.type != "cuda":
            raise ValueError(f"HiFT CUDA graphs need a CUDA device, not {device}")
        channels = self.cfg.in_channels

        def example(b: int, t: int) -> dict[str, torch.Tensor]:
            return {
                "mel": torch.zeros(b, channels, t, device=device, dtype=dtype),
                "lengths": torch.full((b,), t, dtype=torch.long, device=device),
                "start": torch.zeros(b, dtype=torch.long, device=device),
                "phase": torch.zeros(b, self.cfg.nb_harmonics + 1, dtype=torch.float64, device=device),
                "carry_at": torch.zeros(b, dtype=torch.long, device=device),
            }

        self.graphs = GraphBuckets(self.packed, pad_hift_inputs, example, batches, frames, device, "hift", max_work)
        self.graphs.warm(warm)
        return self.graphs


def pad_hift_inputs(inputs: dict[str, torch.Tensor], batch: int, frames: int) -> dict[str, torch.Tensor]:
    """Pad mel with zeros to ``frames`` and add dummy rows (windows at the start); lengths keep
    each real row's own end (dummy rows take the whole bucket)."""
    mel, lengths = inputs["mel"], inputs["lengths"]
    padded = mel.new_zeros(batch, mel.shape[1], frames)
    padded[: mel.shape[0], :, : mel.shape[2]] = mel
    full = lengths.new_full((batch,), frames)
    full[: lengths.shape[0]] = lengths
    rows = {name: inputs[name] for name in ("start", "phase", "carry_at") if name in inputs}
    extra = {name: value.new_zeros(batch, *value.shape[1:]) for name, value in rows.items()}
    for name, value in rows.items():
        extra[name][: value.shape[0]] = value
    return {"mel": padded, "lengths": full, **extra}
