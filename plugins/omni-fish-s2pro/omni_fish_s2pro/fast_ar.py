"""The fast AR (``audio_decoder.*``): after each slow step, the residual codes of its frame.

A small decoder of ``num_codebooks`` positions: position 0 is the slow AR's last hidden state
(after its final norm, projected when the widths differ), position 1 the embedding of the
frame's semantic code (code 0), and each later position the embedding of the code just chosen;
the logits at position ``i`` choose code ``i``. Every request of a slow step runs together in
lock step over one contiguous cache per call (``omni_core.models.lockstep``, whose ``fused`` path
runs the core's fused kernels; the SiLU gate too, ``FeedForward``). Module names are the
checkpoint's, under ``audio_decoder.``; q and k rows are in the halves order (``rotary_pairs``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from omni_core.models.layers import RMSNorm, RotaryEmbedding
from omni_core.models.lockstep import Pass, Passes, attend, pre_norm_layer
from torch import nn

from .config import FishConfig, TransformerSizes
from .feed_forward import FeedForward


class FastAttention(nn.Module):
    def __init__(self, s: TransformerSizes, eps: float):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = s.n_head, s.n_local_heads, s.head_dim
        self.splits = [s.n_head * s.head_dim, s.n_local_heads * s.head_dim, s.n_local_heads * s.head_dim]
        self.wqkv = nn.Linear(s.dim, sum(self.splits), bias=s.qkv_bias)
        self.wo = nn.Linear(s.n_head * s.head_dim, s.dim, bias=False)
        if s.qk_norm:
            self.q_norm, self.k_norm = RMSNorm(s.head_dim, eps), RMSNorm(s.head_dim, eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: torch.Tensor, step: Pass, cache: tuple[torch.Tensor, torch.Tensor], fused: bool) -> torch.Tensor:
        """x [B * n, D]: each row's n new positions; ``cache`` (k, v) [B * num_codebooks, kv_heads, d]."""
        t = x.shape[0]
        q, k, v = self.wqkv(x).split(self.splits, dim=-1)
        q = q.reshape(t, self.heads, self.head_dim)
        k = k.reshape(t, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return self.wo(attend(q, k, v.reshape(t, self.kv_heads, self.head_dim), step, cache, fused))


class FastLayer(nn.Module):
    def __init__(self, s: TransformerSizes, eps: float):
        super().__init__()
        self.attention = FastAttention(s, eps)
        self.feed_forward = FeedForward(s.dim, s.intermediate_size)
        self.attention_norm = RMSNorm(s.dim, eps)
        self.ffn_norm = RMSNorm(s.dim, eps)

    def forward(self, x, residual, step: Pass, cache, fused: bool):
        return pre_norm_layer(self.attention_norm, self.attention, self.ffn_norm, self.feed_forward, x, residual, step, cache, fused)


class FastAR(nn.Module):
    def __init__(self, cfg: FishConfig):
        super().__init__()
        s = cfg.fast
        self.num_codebooks = cfg.num_codebooks
        self.kv_heads, self.head_dim = s.n_local_heads, s.head_dim
        self.project_in = nn.Linear(cfg.slow.dim, s.dim) if s.dim != cfg.slow.dim else nn.Identity()
        self.embeddings = nn.Embedding(cfg.codebook_size, s.dim)
        self.layers = nn.ModuleList(FastLayer(s, cfg.norm_eps) for _ in range(s.n_layer))
        self.norm = RMSNorm(s.dim, cfg.norm_eps)
        self.output = nn.Linear(s.dim, cfg.codebook_size, bias=False)
        self.rotary = RotaryEmbedding(s.head_dim, cfg.num_codebooks, cfg.rope_base)
        self.passes = Passes(self.rotary, self.num_codebooks)

    @torch.inference_mode()
    def forward(
        self,
        slow_hidden: torch.Tensor,
        code0: torch.Tensor,
        choose: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
        fused: bool = False,
    ) -> torch.Tensor:
        """``slow_hidden`` [B, H] and the semantic codes ``code0`` [B] -> the frames' codes
        [B, num_codebooks] (code 0 first). ``choose(logits [B, V], codebook)`` picks each code
        (default: the most likely). ``fused``: the core's triton kernels (see the module doc)."""
        choose = choose or (lambda logits, codebook: logits.argmax(-1))
        b = slow_hidden.shape[0]
        x = torch.stack([self.project_in(slow_hidden), self.embeddings(code0).to(slow_hidden.dtype)], dim=1).reshape(2 * b, -1)
        shape = (b * self.num_codebooks, self.kv_heads, self.head_dim)
        caches = [(x.new_empty(shape), x.new_empty(shape)) for _ in self.layers]
        codes, start = [code0], 0
        for codebook in range(1, self.num_codebooks):
            n = x.shape[0] // b
            step = self.passes.get(b, start, n, x)
            residual = None
            for layer, cache in zip(self.layers, caches, strict=True):
                x, residual = layer(x, residual, step, cache, fused)
            last = self.norm(x, residual, fused=fused)[0].view(b, n, -1)[:, -1]
            code = choose(self.output(last), codebook)
            codes.append(code)
            start += n
            x = self.embeddings(code).to(slow_hidden.dtype)
        return torch.stack(codes, dim=1)
