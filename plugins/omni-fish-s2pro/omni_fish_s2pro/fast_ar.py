"""The fast AR (``audio_decoder.*``): after each slow step, the residual codes of its frame.

A small decoder of ``num_codebooks`` positions: position 0 is the slow AR's last hidden state
(after its final norm, projected when the widths differ), position 1 the embedding of the
frame's semantic code (code 0), and each later position the embedding of the code just chosen;
the logits at position ``i`` choose code ``i``. Every request of a slow step runs together in
lock step, so its cache is one contiguous tensor per call (no paging): row ``b``'s position ``p``
is slot ``b * num_codebooks + p``. Module names are the checkpoint's, under ``audio_decoder.``;
q and k rows are in the halves order (``rotary_pairs``).

With ``fused`` (CUDA, where triton imports) a layer runs the core's fused kernels: the residual
add inside each norm, rotary and the cache write in one kernel, the SiLU gate in one. A step's
passes are launch-bound at any batch (a CUDA graph replay still runs each kernel), so fewer
kernels is what makes them faster.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from omni_core.models import kernels
from omni_core.models.layers import RMSNorm, RotaryEmbedding, apply_rotary
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
        v = v.reshape(t, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        k_cache, v_cache = cache
        if fused:
            kernels.rotary_store_kv(q, k, v, *step.rope, k_cache, v_cache, step.slots)
        else:
            q, k = apply_rotary(q, k, step.rope)
            k_cache[step.slots], v_cache[step.slots] = k, v
        b, n, seen = step.batch, step.new, step.start + step.new
        out = F.scaled_dot_product_attention(
            q.reshape(b, n, self.heads, self.head_dim).transpose(1, 2),
            k_cache.view(b, -1, self.kv_heads, self.head_dim)[:, :seen].transpose(1, 2),
            v_cache.view(b, -1, self.kv_heads, self.head_dim)[:, :seen].transpose(1, 2),
            is_causal=n > 1,
            enable_gqa=self.heads != self.kv_heads,
        )
        return self.wo(out.transpose(1, 2).reshape(t, -1))


class FastLayer(nn.Module):
    def __init__(self, s: TransformerSizes, eps: float):
        super().__init__()
        self.attention = FastAttention(s, eps)
        self.feed_forward = FeedForward(s.dim, s.intermediate_size)
        self.attention_norm = RMSNorm(s.dim, eps)
        self.ffn_norm = RMSNorm(s.dim, eps)

    def forward(self, x, residual, step: Pass, cache, fused: bool):
        """Returns (this layer's feed-forward output, the residual stream before it): their sum is
        the layer's output, added by the next norm (in its kernel, when fused)."""
        if residual is None:
            h, residual = self.attention_norm(x, fused=fused), x
        else:
            h, residual = self.attention_norm(x, residual, fused=fused)
        h = self.attention(h, step, cache, fused)
        h, residual = self.ffn_norm(h, residual, fused=fused)
        return self.feed_forward(h, fused=fused), residual


@dataclass(frozen=True)
class Pass:
    """One pass over ``new`` positions from ``start`` for ``batch`` rows: their rotary rows and cache slots."""

    batch: int
    start: int
    new: int
    rope: tuple[torch.Tensor, torch.Tensor]
    slots: torch.Tensor


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

        # (batch, start, new, device, dtype) -> Pass: made once, so a captured graph reads them
        # instead of recomputing them in a few small kernels every replay
        self._passes: dict[tuple, Pass] = {}

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
            step = self._pass(b, start, n, x)
            residual = None
            for layer, cache in zip(self.layers, caches, strict=True):
                x, residual = layer(x, residual, step, cache, fused)
            last = self.norm(x, residual, fused=fused)[0].view(b, n, -1)[:, -1]
            code = choose(self.output(last), codebook)
            codes.append(code)
            start += n
            x = self.embeddings(code).to(slow_hidden.dtype)
        return torch.stack(codes, dim=1)

    def _pass(self, batch: int, start: int, new: int, like: torch.Tensor) -> Pass:
        key = (batch, start, new, like.device, like.dtype)
        if key not in self._passes:
            device = like.device
            positions = torch.arange(start, start + new, device=device).repeat(batch)
            slots = (torch.arange(batch, device=device) * self.num_codebooks)[:, None] + torch.arange(start, start + new, device=device)
            self._passes[key] = Pass(batch, start, new, self.rotary.table(positions, like.dtype), slots.reshape(-1))
        return self._passes[key]
