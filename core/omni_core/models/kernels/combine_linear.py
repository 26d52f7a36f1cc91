"""Decode attention followed by its output projection, the splits' combine folded into the projection.

Split decode attention (``paged_attention``) ends in a small kernel that combines each head's
splits, and then o_proj reads the combined rows. Here o_proj's programs combine the splits
themselves, each for every head of its rows, as the prologue of the projection: one kernel
boundary less on the layer's critical path, at the price of each program reading all the
partials (from L2: 14 heads x the splits that hold tokens x 64 floats a row for a 0.5B-sized
model). Splits past a row's context are not read. The projection's weight is requested before
the wait, as in ``fused_linear``. Used for decode steps of up to ``kernels.SKINNY_MAX_ROWS``
rows whose heads fit one weight tile; otherwise attention, its combine and the projection run
as separate kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from omni_core.models.kernels.fused_linear import MAX_ROWS, _tile, _weight_tile, linear
from omni_core.models.kernels.launch import launch_options
from omni_core.models.kernels.paged_attention import SplitParts, combine_splits, decode_attention_parts

MAX_TILE = 2048  # the widest input (heads x head_dim) one program's weight tile covers


@triton.jit
def _combined_row(part_ptr, lse_ptr, row, ctx_len, M, partition, num_splits, heads,
                  HEADS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS_PAD: tl.constexpr):
    """Row ``row``'s attention output ([HEADS_PAD, HEAD_DIM] float32, 0 past the heads) from its
    splits: each split's output weighted by exp(its lse - the largest)."""
    h = tl.arange(0, HEADS_PAD)
    s = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, HEAD_DIM)
    live = (s < num_splits) & (s * partition < ctx_len) & (row < M)  # splits that hold tokens
    mask = (h < heads)[:, None] & live[None, :]
    part = (row * heads + h)[:, None] * num_splits + s[None, :]
    lse = tl.load(lse_ptr + part, mask=mask, other=float("-inf"))
    out = tl.load(part_ptr + part[:, :, None] * HEAD_DIM + d[None, None, :], mask=mask[:, :, None], other=0.0)
    top = tl.max(lse, axis=1)
    top = tl.where(top == float("-inf"), 0.0, top)  # a head past the last: every weight 0
    weight = tl.exp(lse - top[:, None])
    total = tl.sum(weight, axis=1)
    return tl.sum(weight[:, :, None] * out, axis=1) / tl.where(total > 0, total, 1.0)[:, None]


@triton.jit
def _combine_linear_kernel(
    part_ptr, lse_ptr, context_lens_ptr, w_ptr, out_ptr,
    M, K, n_cols, partition, num_splits, heads, stride_wn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEADS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS_PAD: tl.constexpr,
    PDL: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    valid = cols < n_cols
    if PDL:  # the next kernel may launch now and request its own weight
        tl.extra.cuda.gdc_launch_dependents()
    # the weight and the context lengths (written before the
    # step's first kernel) are requested before the wait
    w = _weight_tile(w_ptr, cols, valid, stride_wn, tl.arange(0, HEADS_PAD * HEAD_DIM), K)
    row_ids = tl.arange(0, BLOCK_M)
    offs_m = pid_m * BLOCK_M + row_ids
    ctx = tl.load(context_lens_ptr + offs_m, mask=offs_m < M, other=0)
    if PDL:
        tl.extra.cuda.gdc_wait()  # the partials come from the attention kernel
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for m in tl.static_range(BLOCK_M):
        row = pid_m * BLOCK_M + m
        ctx_len = tl.sum(tl.where(row_ids == m, ctx, 0), axis=0)
        x = _combined_row(part_ptr, lse_ptr, row, ctx_len, M, partition, num_splits, heads, HEADS_PAD, HEAD_DIM, SPLITS_PAD)
        # rounded to the weight's dtype, as the separate combine stores it
        x = tl.reshape(x.to(w_ptr.dtype.element_ty).to(tl.float32), [HEADS_PAD * HEAD_DIM])
        dots = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        acc += tl.where((row_ids == m)[:, None], dots[None, :], 0.0)
    tl.store(out_ptr + offs_m[:, None] * stride_om + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(offs_m < M)[:, None] & valid[None, :])


# output columns a program: each program reads every partial of its rows, so fewer, wider programs
# than o_proj's own two columns; 8 warps hold a row's partials (16 heads x 16 splits x 64 floats
# at most for a 0.5B-sized model) without spilling
BLOCK_N = 8
NUM_WARPS = 8


def folds_combine(heads: int, head_dim: int) -> bool:
    """Whether ``attention_output`` folds the combine into the projection for these heads."""
    return head_dim == triton.next_power_of_2(head_dim) and triton.next_power_of_2(heads) * head_dim <= MAX_TILE


def combine_linear(parts: SplitParts, weight: torch.Tensor, block_n: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    """``combine(parts) @ weight^T`` ([B, N] in the weight's dtype) for the splits of a decode
    attention (``decode_attention_parts``) and an output projection ``weight`` [N, heads * head_dim];
    the tile also from ``$OMNI_FUSED_TILES``' ``combine`` role (``fused_linear.tile_override``)."""
    B, heads, num_splits, head_dim = parts.out.shape
    N, K = weight.shape
    if K != heads * head_dim or weight.stride(1) != 1:
        raise ValueError(f"weight {tuple(weight.shape)} does not project {heads} heads of {head_dim} (or lacks unit stride along K)")
    if not folds_combine(heads, head_dim):
        raise ValueError(f"{heads} heads of {head_dim}: more than one weight tile")
    block_n, num_warps, _, _ = _tile("combine", K, block_n, num_warps, None, None)
    block_n, num_warps = block_n or BLOCK_N, num_warps or NUM_WARPS
    out = torch.empty(B, N, dtype=weight.dtype, device=weight.device)
    block_m = min(triton.next_power_of_2(B), MAX_ROWS)
    pdl = launch_options(weight.device)
    _combine_linear_kernel[(triton.cdiv(N, block_n), triton.cdiv(B, block_m))](
        parts.out, parts.lse, parts.context_lens, weight, out,
        B, K, N, parts.partition, num_splits, heads, weight.stride(0), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, HEADS_PAD=triton.next_power_of_2(heads), HEAD_DIM=head_dim,
        SPLITS_PAD=triton.next_power_of_2(num_splits), PDL=pdl, num_warps=num_warps, launch_pdl=pdl,
    )
    return out


def attention_output(q, k_cache, v_cache, block_tables, context_lens, block_size, scale, weight, num_splits=None) -> torch.Tensor:
    """``paged_decode_attention(...)`` ([B, H, D]) flattened to [B, H * D] and projected by
    ``weight`` [N, H * D] (o_proj, no bias): the splits' combine in the projection's kernel
    where ``folds_combine``, else attention, combine and ``fused_linear.linear`` in turn."""
    B, heads, head_dim = q.shape
    out = decode_attention_parts(q, k_cache, v_cache, block_tables, context_lens, block_size, scale, num_splits)
    if isinstance(out, SplitParts):
        if folds_combine(heads, head_dim):
            return combine_linear(out, weight)
        out = combine_splits(out, q.dtype)
    return linear(out.reshape(B, heads * head_dim), weight)
