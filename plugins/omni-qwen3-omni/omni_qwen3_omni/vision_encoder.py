"""Qwen3-Omni's vision encoder (``thinker.visual``): patches in, merged visual tokens and the
deepstack features out.

A patch is ``temporal_patch_size`` frames x ``patch_size``^2 pixels x 3 channels, flattened as
the Qwen2-VL processors lay it out, in spatial-merge-block order (each 2x2 block of patches
consecutive). Patch embedding (a 3-D convolution whose kernel is the patch: one matmul here),
plus a learned square grid of positions resampled bilinearly to each image's grid; blocks of
LayerNorm + attention with 2-D rotary positions (within one frame: every temporal step of a
video attends on its own) + GELU (tanh) MLP. After the blocks named in
``deepstack_visual_indexes`` a merger (LayerNorm after the 2x2 shuffle) gives that depth's
features; the final merger (LayerNorm before it) gives the tokens. Both are ``[patches / 4, out]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from omni_core.models.layers import apply_rotary
from torch import nn


class VisionAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], segments: list[int]) -> torch.Tensor:
        n, dim = x.shape
        q, k, v = self.qkv(x).view(n, 3, self.heads, dim // self.heads).unbind(1)
        # rope: [n, 1, head_dim] float32; rotated in float32, as the reference does
        q, k = (t.to(x.dtype) for t in apply_rotary(q.float(), k.float(), rope))
        out = torch.empty_like(q)
        start = 0
        for length in _runs(segments):  # frames of equal size attend in one batched call
            rows, count = length
            stop = start + rows * count
            shape = (count, rows, self.heads, dim // self.heads)
            qs, ks, vs = (t[start:stop].view(shape).transpose(1, 2) for t in (q, k, v))
            out[start:stop] = F.scaled_dot_product_attention(qs, ks, vs).transpose(1, 2).reshape(rows * count, self.heads, -1)
            start = stop
        return self.proj(out.reshape(n, dim))


def _runs(segments: list[int]) -> list[tuple[int, int]]:
    """Consecutive equal segment lengths as (length, count)."""
    runs: list[tuple[int, int]] = []
    for length in segments:
        if runs and runs[-1][0] == length:
            runs[-1] = (length, runs[-1][1] + 1)
        else:
            runs.append((length, 1))
    return runs


class VisionMLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.linear_fc1 = nn.Linear(dim, hidden)
        self.linear_fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate="tanh"))


class VisionBlock(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = VisionAttention(dim, heads)
        self.mlp = VisionMLP(dim, hidden)

    def forward(self, x, rope, segments):
        x = x + self.attn(self.norm1(x), rope, segments)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """2x2 neighbouring patches -> one token: LayerNorm (before or after gathering them), MLP."""

    def __init__(self, dim: int, out: int, merge: int, norm_after_shuffle: bool):
        super().__init__()
        self.width = dim * merge * merge
        self.norm_after_shuffle = norm_after_shuffle
        self.ln_q = nn.LayerNorm(self.width if norm_after_shuffle else dim, eps=1e-6)
        self.mlp = nn.ModuleList([nn.Linear(self.width, self.width), nn.GELU(), nn.Linear(self.width, out)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln_q(x.view(-1, self.width)) if self.norm_after_shuffle else self.ln_q(x).view(-1, self.width)
        for layer in self.mlp:
            x = layer(x)
        return x


class PatchEmbed(nn.Module):
    def __init__(self, config):
        super().__init__()
        p, t = config.patch_size, config.temporal_patch_size
        kernel = (t, p, p)
        self.proj = nn.Conv3d(config.in_channels, config.hidden_size, kernel_size=kernel, stride=kernel, bias=True)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        # the kernel covers the whole patch: the convolution is one matmul over its flat pixels
        weight = self.proj.weight.reshape(self.proj.weight.shape[0], -1)
        return F.linear(patches.to(weight.dtype), weight, self.proj.bias)


class VisionEncoder(nn.Module):
    """Module names follow the checkpoint (``thinker.visual.*``)."""

    def __init__(self, config):
        super().__init__()
        self.merge = config.spatial_merge_size
        self.patch_embed = PatchEmbed(config)
        self.pos_embed = nn.Embedding(config.num_position_embeddings, config.hidden_size)
        self.grid_side = int(config.num_position_embeddings**0.5)
        heads = config.num_heads
        self.blocks = nn.ModuleList(VisionBlock(config.hidden_size, heads, config.intermediate_size) for _ in range(config.depth))
        self.merger = PatchMerger(config.hidden_size, config.out_hidden_size, self.merge, norm_after_shuffle=False)
        self.deepstack_visual_indexes = list(config.deepstack_visual_indexes)
        self.merger_list = nn.ModuleList(
            PatchMerger(config.hidden_size, config.out_hidden_size, self.merge, norm_after_shuffle=True)
            for _ in self.deepstack_visual_indexes
        )
        head_dim = config.hidden_size // heads
        params = getattr(config, "rope_parameters", None) or {}
        theta = float(params.get("rope_theta", 10000.0))
        spatial = head_dim // 2
        self.register_buffer("inv_freq", 1.0 / (theta ** (torch.arange(0, spatial, 2, dtype=torch.float) / spatial)), persistent=False)
        if config.hidden_act != "gelu_pytorch_tanh":
            raise ValueError(f"vision activation {config.hidden_act!r} is not supported (gelu_pytorch_tanh)")

    @torch.inference_mode()
    def forward(self, patches: torch.Tensor, grids: list[tuple[int, int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """``patches`` [N, C * t * p * p] of images and videos in order, ``grids`` their (t, h, w)
        in patches -> (tokens [N / 4, out], deepstack [len(deepstack_visual_indexes), N / 4, out])."""
        device = self.pos_embed.weight.device
        rows, cols = merge_order(grids, self.merge, device)
        x = self.patch_embed(patches.to(device))
        x = x + self._positions(grids, rows, cols).to(x.dtype)
        freqs = torch.cat([rows[:, None] * self.inv_freq, cols[:, None] * self.inv_freq], dim=-1)
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]
        rope = (emb.cos(), emb.sin())
        segments = [h * w for t, h, w in grids for _ in range(t)]
        deep = []
        for index, block in enumerate(self.blocks):
            x = block(x, rope, segments)
            if index in self.deepstack_visual_indexes:
                deep.append(self.merger_list[self.deepstack_visual_indexes.index(index)](x))
        tokens = self.merger(x)
        return tokens, (torch.stack(deep) if deep else tokens.new_zeros(0, *tokens.shape))

    def _positions(self, grids, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """The learned square grid resampled bilinearly (corners aligned) to each image's grid."""
        side = self.grid_side
        heights = torch.cat([torch.full((t * h * w,), h) for t, h, w in grids]).to(rows.device)
        widths = torch.cat([torch.full((t * h * w,), w) for t, h, w in grids]).to(rows.device)
        r_taps, r_weights = _bilinear(rows, heights, side)
        c_taps, c_weights = _bilinear(cols, widths, side)
        index = (r_taps[:, :, None] * side + c_taps[:, None, :]).reshape(-1, 4)
        weight = (r_weights[:, :, None] * c_weights[:, None, :]).reshape(-1, 4)
        return (self.pos_embed(index) * weight[:, :, None].to(self.pos_embed.weight.dtype)).sum(1)


def _bilinear(index: torch.Tensor, size: torch.Tensor, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The two source cells of each target cell and their weights along one axis."""
    src = index.float() * (side - 1) / torch.clamp(size - 1, min=1).float()
    floor = torch.floor(src)
    taps = floor.long()[:, None] + torch.arange(2, device=index.device)
    weights = (1 - (src[:, None] - taps.float()).abs()).clamp(min=0)
    return taps.clamp(0, side - 1), weights


def merge_order(grids: list[tuple[int, int, int]], merge: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each patch's (row, column) in its frame, patches listed in spatial-merge-block order."""
    rows, cols = [], []
    for t, h, w in grids:
        r = torch.arange(h).view(h // merge, merge, 1, 1).expand(-1, -1, w // merge, merge)
        c = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, -1, -1)
        rows.append(r.permute(0, 2, 1, 3).reshape(-1).repeat(t))
        cols.append(c.permute(0, 2, 1, 3).reshape(-1).repeat(t))
    return torch.cat(rows).to(device), torch.cat(cols).to(device)
