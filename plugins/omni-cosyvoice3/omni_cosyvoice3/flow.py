"""Speech tokens -> 80-bin mel at 50 Hz: token embedding, pre-lookahead, 2x repeat, conditional flow matching.

Names follow the official ``flow.pt``. ``FlowModel.infer`` runs a batch of requests at once (right
padding; every layer is causal in time or masked, so a request's frames do not depend on its
padding or on the other rows). A non-final chunk holds back its last ``pre_lookahead_len``
tokens as right context, exactly as the one-shot pass would see them.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import FlowConfig
from .dit import DiT
from .flow_cache import CachedCall, CachedFrames, FlowCache, pad_cached_inputs, pad_to
from .graph_buckets import GraphBuckets

log = logging.getLogger(__name__)

NOISE_FRAMES = 50 * 300  # 300 s of 50 Hz mel frames of fixed noise


class PreLookaheadLayer(nn.Module):
    """Each token sees itself and the next ``lookahead`` tokens (conv1), then two earlier ones (conv2)."""

    def __init__(self, channels_in: int, channels: int, lookahead: int):
        super().__init__()
        self.lookahead = lookahead
        self.conv1 = nn.Conv1d(channels_in, channels, kernel_size=lookahead + 1)
        self.conv2 = nn.Conv1d(channels, channels_in, kernel_size=3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, N, C], zeros past each row's end
        h = F.pad(x.transpose(1, 2), (0, self.lookahead))
        h = F.leaky_relu(self.conv1(h))
        h = self.conv2(F.pad(h, (self.conv2.kernel_size[0] - 1, 0)))
        return h.transpose(1, 2) + x


class ConditionalCFM(nn.Module):
    """Euler integration of the learned velocity on a cosine time grid, with classifier-free guidance."""

    def __init__(self, cfg: FlowConfig):
        super().__init__()
        self.cfg = cfg
        self.estimator = DiT(cfg)
        gen = torch.Generator().manual_seed(0)
        # fixed noise, not a checkpoint tensor: every request starts from the same z at frame f
        self.register_buffer(
            "rand_noise", torch.randn(1, cfg.mel_bins, NOISE_FRAMES, generator=gen), persistent=False
        )

    @torch.inference_mode()
    def forward(self, mu, valid, spks, cond, streaming, past=None) -> torch.Tensor:
        """``past`` (a ``flow_cache.CachedFrames``): the frames are each row's new frames after
        its cached ones, starting at its own position of the fixed noise."""
        b, _, t = mu.shape
        if t > NOISE_FRAMES:
            raise ValueError(f"utterance of {t} mel frames exceeds the {NOISE_FRAMES}-frame limit")
        # the ODE state stays float32 whatever the estimator's dtype
        if past is None:
            x = self.rand_noise[:, :, :t].float().expand(b, -1, -1).clone()
        else:
            x = self.rand_noise[0][:, past.positions.clamp(max=NOISE_FRAMES - 1)].float().transpose(0, 1)
        grid = 1 - torch.cos(
            torch.linspace(0, 1, self.cfg.n_timesteps + 1, device=mu.device) * 0.5 * torch.pi
        )
        zeros = torch.zeros_like
        # conditional rows first, then unconditional rows (no mu, speaker or prompt)
        mu2, spks2, cond2 = (
            torch.cat([mu, zeros(mu)]),
            torch.cat([spks, zeros(spks)]),
            torch.cat([cond, zeros(cond)]),
        )
        valid2, streaming2 = torch.cat([valid, valid]), torch.cat([streaming, streaming])
        rate = self.cfg.cfg_rate
        for step in range(self.cfg.n_timesteps):
            t_now, dt = grid[step], grid[step + 1] - grid[step]
            tt = t_now.expand(2 * b).to(mu.dtype)
            x_in = x.to(mu.dtype)
            step_past = None if past is None else past.at(step)
            v = self.estimator(torch.cat([x_in, x_in]), valid2, mu2, tt, spks2, cond2, streaming2, step_past)
            v = v.float()
            v_cond, v_uncond = v[:b], v[b:]
            x = x + dt * ((1.0 + rate) * v_cond - rate * v_uncond)
        return x


@dataclass
class FlowRequest:
    """One row of a flow batch: all tokens so far (prompt first) and the prompt's mel [P, 80].
    ``first_frame``: the first frame after the prompt that the caller wants back; ``request_id``
    names its entry in a ``FlowCache``."""

    tokens: torch.Tensor  # [N] int
    prompt_token_len: int
    prompt_mel: torch.Tensor  # [P, 80], P = token_mel_ratio * prompt_token_len
    embedding: torch.Tensor  # [192] x-vector
    finalize: bool
    streaming: bool
    first_frame: int = 0
    request_id: str | None = None


class FlowModel(nn.Module):
    def __init__(self, cfg: FlowConfig):
        super().__init__()
        self.cfg = cfg
        self.input_embedding = nn.Embedding(cfg.vocab_size, cfg.mel_bins)
        self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, cfg.mel_bins)
        self.pre_lookahead_layer = PreLookaheadLayer(
            cfg.mel_bins, cfg.pre_lookahead_channels, cfg.pre_lookahead_len
        )
        self.decoder = ConditionalCFM(cfg)
        self.graphs: GraphBuckets | None = None  # CUDA graphs of the Euler loop (use_graphs)

    @property
    def dtype(self) -> torch.dtype:
        return self.input_embedding.weight.dtype

    def mel_frames(self, req: FlowRequest) -> int:
        """Frames after the prompt that this call produces."""
        usable = len(req.tokens) - (0 if req.finalize else self.cfg.pre_lookahead_len)
        return (usable - req.prompt_token_len) * self.cfg.token_mel_ratio

    def prepare(self, requests: list[FlowRequest]) -> tuple[dict[str, torch.Tensor], list[int]]:
        """The decoder's inputs for a batch (built on the host, moved in one copy each) and each
        request's last mel frame (prompt included)."""
        device, dtype, ratio = self.input_embedding.weight.device, self.dtype, self.cfg.token_mel_ratio
        lens = [len(r.tokens) for r in requests]
        usable = [
            n - (0 if r.finalize else self.cfg.pre_lookahead_len) for n, r in zip(lens, requests, strict=True)
        ]
        frames = [u * ratio for u in usable]
        b, n_max, t_max = len(requests), max(lens), max(frames)
        tokens = torch.zeros(b, n_max, dtype=torch.long)
        token_mask = torch.zeros(b, n_max, 1)
        cond = torch.zeros(b, t_max, self.cfg.mel_bins)
        for i, r in enumerate(requests):
            tokens[i, : lens[i]] = r.tokens.long().clamp(min=0)
            token_mask[i, : lens[i]] = 1
            cond[i, : r.prompt_mel.shape[0]] = r.prompt_mel.float()
        valid = torch.arange(t_max)[None, :] < torch.tensor(frames)[:, None]
        tokens, token_mask = tokens.to(device), token_mask.to(device, dtype)
        valid = valid.to(device)
        h = self.pre_lookahead_layer(self.input_embedding(tokens) * token_mask)
        mu = h.repeat_interleave(ratio, dim=1)[:, :t_max]  # [B, T, 80]
        mu = mu * valid[:, :, None].to(dtype)
        spks = torch.stack([r.embedding.float() for r in requests]).to(device)
        spks = self.spk_embed_affine_layer(F.normalize(spks, dim=1).to(dtype))
        inputs = {
            "mu": mu.transpose(1, 2),
            "valid": valid,
            "spks": spks,
            "cond": cond.to(device, dtype).transpose(1, 2),
            "streaming": torch.tensor([r.streaming for r in requests]).to(device),
        }
        return inputs, frames

    def use_graphs(
        self,
        batches: tuple[int, ...],
        frames: tuple[int, ...],
        warm: list[tuple[int, int]] = (),
        max_work: int | None = None,
    ) -> GraphBuckets:
        """Run the decoder's whole Euler loop as CUDA graphs per (batch, frames) bucket."""
        device = self.input_embedding.weight.device
        if device.type != "cuda":
            raise ValueError(f"flow CUDA graphs need a CUDA device, not {device}")
        mel_bins, dtype = self.cfg.mel_bins, self.dtype

        def example(b: int, t: int) -> dict[str, torch.Tensor]:
            return {
                "mu": torch.zeros(b, mel_bins, t, device=device, dtype=dtype),
                "valid": torch.ones(b, t, dtype=torch.bool, device=device),
                "spks": torch.zeros(b, mel_bins, device=device, dtype=dtype),
                "cond": torch.zeros(b, mel_bins, t, device=device, dtype=dtype),
                "streaming": torch.ones(b, dtype=torch.bool, device=device),
            }

        self.graphs = GraphBuckets(self.decoder, pad_flow_inputs, example, batches, frames, device, "flow", max_work)
        self.graphs.warm(warm)
        return self.graphs

    @torch.inference_mode()
    def infer(self, requests: list[FlowRequest], cache: FlowCache | None = None) -> list[torch.Tensor]:
        """Returns, per request, the mel [80, frames] of its tokens after the prompt, from its
        ``first_frame`` on. With a ``cache``, chunk-masked calls that end on a chunk boundary
        compute only the frames past those cached for their ``request_id`` (in one batch), and
        cache the new ones; the other requests run in one batch over all their frames."""
        ends = [self.total_frames(r) for r in requests]
        cached = [
            i
            for i, r in enumerate(requests)
            if cache is not None
            and r.request_id is not None
            and r.streaming
            and cache.cached_frames(r.request_id) <= r.prompt_mel.shape[0] + r.first_frame
            and cache.reserve(r.request_id, ends[i], last=r.finalize)
        ]
        if log.isEnabledFor(logging.DEBUG):  # what each call computes, for `--log-level debug`
            queries = [e - (cache.cached_frames(r.request_id) if i in cached else 0) for i, (r, e) in enumerate(zip(requests, ends, strict=True))]
            log.debug("flow: %d rows (%d on the cache), query frames %d (largest %d), key frames up to %d", len(requests), len(cached), sum(queries), max(queries), max(ends))
        out: list[torch.Tensor | None] = [None] * len(requests)
        if cached:
            for i, mel in zip(cached, self._infer_cached([requests[i] for i in cached], cache), strict=True):
                out[i] = mel
        rest = [i for i in range(len(requests)) if out[i] is None]
        if rest:
            for i, mel in zip(rest, self._infer_all([requests[i] for i in rest]), strict=True):
                out[i] = mel
        return out

    def total_frames(self, req: FlowRequest) -> int:
        """Frames of this call, prompt included."""
        return req.prompt_mel.shape[0] + self.mel_frames(req)

    def _infer_all(self, requests: list[FlowRequest]) -> list[torch.Tensor]:
        inputs, frames = self.prepare(requests)
        mel = None
        if self.graphs is not None:
            mel = self.graphs.run(inputs, len(requests), max(frames))
        if mel is None:
            mel = self.decoder(**inputs)
        return [mel[i, :, r.prompt_mel.shape[0] + r.first_frame : frames[i]] for i, r in enumerate(requests)]

    def _infer_cached(self, requests: list[FlowRequest], cache: FlowCache) -> list[torch.Tensor]:
        """Each row's frames past its cached ones: the inputs of those frames only (the token
        embedding runs over all tokens: it is cheap next to the DiT), queries over them alone.
        On CUDA with ``cache.use_graphs``, as CUDA graphs per (batch, queries, keys) bucket."""
        call, tensors = self.cached_inputs(requests, cache)
        packed = None
        if self.graphs is not None and cache.use_graphs:
            if cache.graphs is None:
                cache.graphs = self._cached_graphs(cache)
            packed = cache.graphs.run(tensors, len(requests), max(call.new), max(call.ends))
        if packed is None:
            packed = self.decode_cached(cache, **tensors)
        mel, conv = self._unpack(packed, cache)
        call.commit(conv.to(cache.dtype))
        out = []
        for i, r in enumerate(requests):
            # frames [start, end) came back; the caller wants those from prompt + first_frame on
            skip = r.prompt_mel.shape[0] + r.first_frame - call.starts[i]
            out.append(mel[i, :, skip : call.new[i]])
        return out

    def cached_inputs(self, requests: list[FlowRequest], cache: FlowCache) -> tuple[CachedCall, dict]:
        """A cached call of ``requests`` (their blocks reserved) and ``decode_cached``'s inputs."""
        inputs, frames = self.prepare(requests)
        call = cache.batch([r.request_id for r in requests], frames)
        pick = call.inputs["positions"][:, None, :].expand(-1, self.cfg.mel_bins, -1)
        tensors = {
            **call.inputs,
            "mu": inputs["mu"].gather(2, pick),
            "cond": inputs["cond"].gather(2, pick),
            "spks": inputs["spks"],
        }
        return call, tensors

    def decode_cached(self, cache: FlowCache, positions, ends, new, write, read, conv, mu, cond, spks):
        """The Euler loop over a cached call's new frames (``flow_cache.CachedCall.inputs``),
        reading and extending ``cache``'s pool. Returns per row its mel [80, n] and its position
        conv's context after the call, flattened side by side (one tensor: a graph's output)."""
        past = CachedFrames(cache, positions, ends, new, write, read, conv)
        streaming = torch.ones(positions.shape[0], dtype=torch.bool, device=positions.device)
        mel = self.decoder(mu=mu, valid=past.valid, spks=spks, cond=cond, streaming=streaming, past=past)
        conv_rows = past.conv_rows().permute(2, 0, 1, 3, 4, 5).float()  # [B, steps, 2, 2, ctx, dim]
        return torch.cat([mel.flatten(1), conv_rows.flatten(1)], dim=1)

    def _unpack(self, packed: torch.Tensor, cache: FlowCache) -> tuple[torch.Tensor, torch.Tensor]:
        """``decode_cached``'s output -> mel [B, 80, n] and conv context [steps, 2, B, 2, ctx, dim]."""
        conv_size = math.prod(cache.conv_shape)
        b, mel_bins = packed.shape[0], self.cfg.mel_bins
        mel = packed[:, : packed.shape[1] - conv_size].view(b, mel_bins, -1)
        conv = packed[:, packed.shape[1] - conv_size :].reshape(b, *cache.conv_shape)
        return mel, conv.permute(1, 2, 0, 3, 4, 5)

    def _cached_graphs(self, cache: FlowCache) -> GraphBuckets:
        """CUDA graphs of ``decode_cached`` per (batch, query frames, key frames) bucket, on the
        flow graphs' batch and frame buckets (both frame counts round up to the frame buckets)."""
        device, mel_bins, dtype = cache.device, self.cfg.mel_bins, self.dtype
        steps, cfg_rows, convs, ctx, dim = cache.conv_shape

        def example(b: int, n: int, t: int) -> dict[str, torch.Tensor]:
            def zeros(*shape, kind=torch.long):
                return torch.zeros(shape, device=device, dtype=kind)

            return {
                "positions": zeros(b, n),
                "ends": torch.ones(b, dtype=torch.long, device=device),
                "new": zeros(b),
                "write": zeros(b, n),
                "read": zeros(b, t),
                "conv": zeros(steps, cfg_rows, b, convs, ctx, dim, kind=dtype),
                "mu": zeros(b, mel_bins, n, kind=dtype),
                "cond": zeros(b, mel_bins, n, kind=dtype),
                "spks": zeros(b, mel_bins, kind=dtype),
            }

        g = self.graphs
        fn = functools.partial(self.decode_cached, cache)
        return GraphBuckets(fn, pad_cached_inputs, example, g.batches, g.frames, device, "flow-cache", g.max_work)


def pad_flow_inputs(inputs: dict[str, torch.Tensor], batch: int, frames: int) -> dict[str, torch.Tensor]:
    """Pad the decoder's inputs to ``batch`` rows and ``frames`` frames. Padded frames are not
    valid (masked out of the attention keys; the position conv is causal), so a real row's real
    frames are unchanged. Dummy rows are all valid, so their attention has keys (no NaN)."""
    b = inputs["mu"].shape[0]
    mel_bins = inputs["mu"].shape[1]
    valid = pad_to(inputs["valid"], (batch, frames), False)
    valid[b:] = True
    return {
        "mu": pad_to(inputs["mu"], (batch, mel_bins, frames), 0),
        "valid": valid,
        "spks": pad_to(inputs["spks"], (batch, mel_bins), 0),
        "cond": pad_to(inputs["cond"], (batch, mel_bins, frames), 0),
        "streaming": pad_to(inputs["streaming"], (batch,), True),
    }
