"""Paged decode attention: one new query token per sequence against its cached K/V.

K/V are read straight from the paged cache through the block table (no gather, no mask tensor).
A program owns one (sequence, KV head, split): the query heads sharing that KV head form the rows
of one matrix (grouped-query attention without repeating K/V), and an online softmax in float32
runs over the split's tokens. With several splits (flash-decoding), each writes its partial
output and log-sum-exp and a small kernel combines them, so a batch of one with two KV heads
still spreads over the GPU. All grid sizes depend only on the batch size and the block-table
width, and lengths are read from device tensors: the kernels can be captured in CUDA graphs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from omni_core.models.kernels.launch import launch_options, multiprocessors


@triton.jit
def _tile_blocks(block_tables_ptr, seq, pos, end, stride_table, KV_BLOCK: tl.constexpr):
    """The cache blocks holding positions ``pos`` (those before ``end``) of sequence ``seq``."""
    return tl.load(block_tables_ptr + seq * stride_table + pos // KV_BLOCK, mask=pos < end, other=0).to(tl.int64)


@triton.jit
def _kv_tile(k_cache_ptr, v_cache_ptr, blocks, kv_head, pos, end, dims, stride_cache_slot, stride_cache_head,
             KV_BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr):
    """K and V of positions ``pos`` (those before ``end``) of one KV head, in ``blocks`` (``_tile_blocks``)."""
    valid = pos < end
    slot = blocks * KV_BLOCK + pos % KV_BLOCK
    kv_offset = slot[:, None] * stride_cache_slot + kv_head * stride_cache_head + dims[None, :]
    kv_mask = valid[:, None] & (dims < HEAD_DIM)[None, :]
    k = tl.load(k_cache_ptr + kv_offset, mask=kv_mask, other=0.0)
    v = tl.load(v_cache_ptr + kv_offset, mask=kv_mask, other=0.0)
    return k, v, kv_offset, kv_mask, valid


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
    out_ptr, part_out_ptr, part_lse_ptr,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_cache_slot, stride_cache_head, stride_table,
    scale, partition_size, num_splits, num_heads,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
    KV_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    # lengths, block tables and every cached token but the newest were written before this step's
    # first kernel: the split's first K/V tile is requested before waiting on the previous kernel
    context_len = tl.load(context_lens_ptr + seq).to(tl.int32)
    start = split * partition_size
    end = tl.minimum(start + partition_size, context_len)
    dims = tl.arange(0, DIM_PAD)
    pos = start + tl.arange(0, BLOCK_N)
    blocks = _tile_blocks(block_tables_ptr, seq, pos, end, stride_table, KV_BLOCK)
    k, v, kv_offset, kv_mask, valid = _kv_tile(k_cache_ptr, v_cache_ptr, blocks, kv_head, pos, end, dims, stride_cache_slot, stride_cache_head,
                                               KV_BLOCK, HEAD_DIM)
    if PDL:  # see kernels.launch: the next kernel may start; q and the newest K/V come from the previous one
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    newest = (valid & (pos == context_len - 1))[:, None] & kv_mask
    k = tl.where(newest, tl.load(k_cache_ptr + kv_offset, mask=newest, other=0.0), k)
    v = tl.where(newest, tl.load(v_cache_ptr + kv_offset, mask=newest, other=0.0), v)

    rows = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + rows
    q_mask = (rows < GROUP)[:, None] & (dims < HEAD_DIM)[None, :]
    q = tl.load(q_ptr + seq * stride_qt + heads[:, None] * stride_qh + dims[None, :], mask=q_mask, other=0.0)
    q = q.to(k_cache_ptr.dtype.element_ty)

    row_max = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    row_sum = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
    # the loop requests the next tile's K/V before this tile's arithmetic, and the block ids of the
    # tile after that: one memory round trip a tile on the critical path, not two
    next_blocks = _tile_blocks(block_tables_ptr, seq, pos + BLOCK_N, end, stride_table, KV_BLOCK)
    n0 = start
    while n0 < end:  # a while loop: its bounds are device values (a for loop over them does not interpret)
        pos = n0 + BLOCK_N + tl.arange(0, BLOCK_N)  # the next tile (all masked off after the last)
        next_k, next_v, _, _, next_valid = _kv_tile(k_cache_ptr, v_cache_ptr, next_blocks, kv_head, pos, end, dims, stride_cache_slot,
                                                    stride_cache_head, KV_BLOCK, HEAD_DIM)
        next_blocks = _tile_blocks(block_tables_ptr, seq, pos + BLOCK_N, end, stride_table, KV_BLOCK)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        scores = tl.where(valid[None, :], scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        correction = tl.exp(row_max - new_max)
        p = tl.exp(scores - new_max[:, None])
        row_sum = row_sum * correction + tl.sum(p, axis=1)
        acc = acc * correction[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        row_max = new_max
        n0 += BLOCK_N
        k, v, valid = next_k, next_v, next_valid

    has_tokens = row_sum > 0  # false only for a split past the end of the context
    out = acc / tl.where(has_tokens, row_sum, 1.0)[:, None]
    out_mask = (rows < GROUP)[:, None] & (dims < HEAD_DIM)[None, :]
    if SPLIT:
        part = (seq * num_heads + heads) * num_splits + split
        tl.store(part_out_ptr + part[:, None] * HEAD_DIM + dims[None, :], out, mask=out_mask)
        lse = tl.where(has_tokens, row_max + tl.log(tl.where(has_tokens, row_sum, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + part, lse, mask=rows < GROUP)
    else:
        ptr = out_ptr + seq * stride_ot + heads[:, None] * stride_oh + dims[None, :]
        tl.store(ptr, out.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _combine_splits_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, stride_ot, stride_oh, num_splits, num_heads,
    SPLITS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, DIM_PAD)
    base = (seq * num_heads + head) * num_splits
    lse = tl.load(part_lse_ptr + base + splits, mask=splits < num_splits, other=float("-inf"))
    weights = tl.exp(lse - tl.max(lse, axis=0))
    mask = (splits < num_splits)[:, None] & (dims < HEAD_DIM)[None, :]
    parts = tl.load(part_out_ptr + (base + splits)[:, None] * HEAD_DIM + dims[None, :], mask=mask, other=0.0)
    out = tl.sum(weights[:, None] * parts, axis=0) / tl.sum(weights, axis=0)
    tl.store(out_ptr + seq * stride_ot + head * stride_oh + dims, out.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)


# programs a multiprocessor gets from the split rule below: on the H200 (2 KV heads, 512-token
# contexts) four beat one, two, eight and sixteen in the engine's graphs at batch 32 and came within
# 1% of the best at 8 and 64 (docs/experiments/2026-12-03-gpu-decode-kernels.md, decode attention at 8-64 sequences)
PROGRAMS_PER_SM = 4


def default_num_splits(batch: int, kv_heads: int, width_tokens: int, device: torch.device, block_n: int = 64) -> int:
    """Enough splits for about ``PROGRAMS_PER_SM`` programs on each multiprocessor, none shorter than
    a tile. Each program waits on one K/V tile at a time, so more, shorter programs hide more of
    that wait: on the H200 splitting made one layer's attention 2.7x faster at batch 1; in the
    engine, four programs a multiprocessor beat one by 2% / 10% / 3% at batch 8 / 32 / 64."""
    wanted = PROGRAMS_PER_SM * multiprocessors(device) // (batch * kv_heads)
    return max(1, min(wanted, triton.cdiv(width_tokens, block_n)))


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    block_size: int,
    scale: float,
    num_splits: int | None = None,
    block_n: int = 64,
) -> torch.Tensor:
    """q [B, H, D] (unit stride along D); caches [slots, KVH, D]; block_tables [B, W] (token
    ``i`` of sequence ``b`` is slot ``block_tables[b, i // block_size] * block_size + i % block_size``);
    context_lens [B] (>= 1). Returns [B, H, D] in q's dtype."""
    B, heads, dim = q.shape
    kv_heads = k_cache.shape[1]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not group over {kv_heads} KV heads")
    if q.stride(2) != 1 or k_cache.stride(2) != 1 or k_cache.stride() != v_cache.stride():
        raise ValueError("q and the caches need unit stride along head_dim, and both caches one layout")
    group = heads // kv_heads
    width_tokens = block_tables.shape[1] * block_size
    if num_splits is None:
        num_splits = default_num_splits(B, kv_heads, width_tokens, q.device, block_n)
    partition = triton.cdiv(triton.cdiv(width_tokens, max(1, num_splits)), block_n) * block_n
    num_splits = triton.cdiv(width_tokens, partition)
    out = torch.empty(B, heads, dim, dtype=q.dtype, device=q.device)
    if B == 0:
        return out
    split = num_splits > 1
    pdl = launch_options(q.device)
    if split:
        part_out = torch.empty(B, heads, num_splits, dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(B, heads, num_splits, dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out  # unused
    _paged_decode_kernel[(B, kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, part_out, part_lse,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), k_cache.stride(0), k_cache.stride(1), block_tables.stride(0),
        scale, partition, num_splits, heads,
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=dim, DIM_PAD=max(16, triton.next_power_of_2(dim)),
        KV_BLOCK=block_size, BLOCK_N=block_n, SPLIT=split,
        PRECISION="ieee" if k_cache.dtype == torch.float32 else "tf32", PDL=pdl, launch_pdl=pdl,
    )
    if split:
        _combine_splits_kernel[(B, heads)](
            part_out, part_lse, out, out.stride(0), out.stride(1), num_splits, heads,
            SPLITS_PAD=triton.next_power_of_2(num_splits), HEAD_DIM=dim, DIM_PAD=triton.next_power_of_2(dim), PDL=pdl, launch_pdl=pdl,
        )
    return out
