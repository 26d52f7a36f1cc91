"""Small decoders whose rows all run in lock step over one contiguous cache: a talker's code
predictor, a dual-AR model's fast AR. Each call starts a fresh cache per row, takes the same
number of positions for every row in each pass, and row ``b``'s position ``p`` is cache slot
``b * positions + p`` (no paging).

With ``fused`` (CUDA, where triton imports) a layer runs the core's fused kernels: the residual
add inside each norm, rotary with the cache write in one kernel. A pass is launch-bound at any
batch (a CUDA graph replay still runs each kernel), so fewer kernels is what makes it faster.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from omni_core.models import kernels
from omni_core.models.layers import RotaryEmbedding, apply_rotary
from omni_core.platforms import platform_for


def fuses(device: torch.device | str) -> bool:
    """Whether the ``fused`` path runs on ``device``: its platform runs the core's Triton kernels
    (CUDA) and triton imports."""
    return platform_for(torch.device(device)).attention_backend == "triton" and kernels.triton_available()


@dataclass(frozen=True)
class Pass:
    """One pass over ``new`` positions from ``start`` for ``batch`` rows: their rotary rows and cache slots."""

    batch: int
    start: int
    new: int
    rope: tuple[torch.Tensor, torch.Tensor]
    slots: torch.Tensor


class Passes:
    """Each pass shape's rotary rows and slots, made once (a captured graph then reads them
    instead of recomputing them in a few small kernels every replay)."""

    def __init__(self, rotary: RotaryEmbedding, positions: int):
        self.rotary, self.positions = rotary, positions
        self._made: dict[tuple, Pass] = {}

    def get(self, batch: int, start: int, new: int, like: torch.Tensor) -> Pass:
        key = (batch, start, new, like.device, like.dtype)
        if key not in self._made:
            device = like.device
            positions = torch.arange(start, start + new, device=device).repeat(batch)
            slots = (torch.arange(batch, device=device) * self.positions)[:, None] + torch.arange(start, start + new, device=device)
            self._made[key] = Pass(batch, start, new, self.rotary.table(positions, like.dtype), slots.reshape(-1))
        return self._made[key]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step: Pass, cache: tuple[torch.Tensor, torch.Tensor], fused: bool) -> torch.Tensor:
    """q [T, heads, d], k and v [T, kv_heads, d] of the pass's rows (T = batch x new): rotates q
    and k, writes k and v to the cache (k, v) [batch x positions, kv_heads, d] and attends each
    row to its positions so far; returns [T, heads x d]."""
    k_cache, v_cache = cache
    if fused:
        kernels.rotary_store_kv(q, k, v, *step.rope, k_cache, v_cache, step.slots)
    else:
        q, k = apply_rotary(q, k, step.rope)
        k_cache[step.slots], v_cache[step.slots] = k, v
    heads, kv_heads, dim = q.shape[1], k_cache.shape[1], q.shape[2]
    b, n, seen = step.batch, step.new, step.start + step.new
    mask = None
    if n > 1 and step.start:  # SDPA's is_causal aligns to the first key: past a prefix it needs a mask
        mask = torch.arange(seen, device=q.device)[None, :] <= torch.arange(step.start, seen, device=q.device)[:, None]
    out = F.scaled_dot_product_attention(
        q.reshape(b, n, heads, dim).transpose(1, 2),
        k_cache.view(b, -1, kv_heads, dim)[:, :seen].transpose(1, 2),
        v_cache.view(b, -1, kv_heads, dim)[:, :seen].transpose(1, 2),
        attn_mask=mask,
        is_causal=n > 1 and not step.start,
        enable_gqa=heads != kv_heads,
    )
    return out.transpose(1, 2).reshape(b * n, heads * dim)


def pre_norm_layer(attention_norm, attention, mlp_norm, mlp, x, residual, step: Pass, cache, fused: bool):
    """One pre-norm decoder layer on the residual stream: returns (its MLP output, the residual
    stream before it), whose sum is the layer's output, added by the next norm (in its kernel,
    when fused). ``residual`` None: ``x`` is the stream's start."""
    if residual is None:
        h, residual = attention_norm(x, fused=fused), x
    else:
        h, residual = attention_norm(x, residual, fused=fused)
    h = attention(h, step, cache, fused)
    h, residual = mlp_norm(h, residual, fused=fused)
    return mlp(h, fused=fused), residual
