"""Mixture-of-experts feed-forward on CUDA in a few kernels and no host sync, so MoE decoders run
inside the engine's decode graphs.

``route``: the router's logits (one library matmul), then one program per token for the softmax
over experts, the top-k and the optional renormalisation (one program a token computing the logits
too read the whole router weight on one multiprocessor: 29 us a layer on an H100 at batch 1).
Then one of two expert paths:

- few (token, expert) pairs (decode: ``pairs <= GEMV_MAX_PAIRS``): each program multiplies one
  token with one expert's weight rows, streaming them once (a decode step is bound by reading the
  chosen experts' weights); the gate/up program applies the SiLU gate; the down program sums a
  token's experts, weighted, into its output row, so no per-pair buffer is reduced afterwards;
- many pairs (prefill, large batches): pairs are sorted by expert into blocks of ``BLOCK_M``
  rows (``align``: fixed-size torch ops, padding each expert's pairs to a whole block), and a
  grouped matmul on the tensor cores runs each block against its expert's weight; the down
  projection writes each pair's weighted row, and the pairs of a token are summed.

Experts are stored stacked as the core's ``Experts`` holds them: ``gate_up`` [E, 2I, H] (gate
rows, then up rows), ``down`` [E, H, I]. Sums accumulate in float32; the gate/up products are
rounded to the stream's dtype before the activation, as the unfused path rounds them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

GEMV_MAX_PAIRS = 64  # (token, expert) pairs up to which the per-pair kernels run (more: slower served, docs/experiments/2026-12-06-qwen3-omni-serve-e2e.md)
# tile sizes: per-pair kernels' output columns a program (gate/up pairs, down) and K step; grouped
# kernels' rows a block (few pairs / many), columns and K step (benchmarks/fused_moe_gpu.py tunes them)
TILES = dict(gemv_gate_up_n=16, gemv_down_n=16, gemv_k=256, gemv_warps=8, gemv_max_pairs=GEMV_MAX_PAIRS,
             grouped_m_small=16, grouped_m=64, grouped_n=64, grouped_k=64, grouped_warps=4)
# loop bounds are compile-time constants (model sizes): the kernels specialise on them


@triton.jit
def _topk_kernel(logits_ptr, ids_ptr, weights_ptr, E, stride_l, TOP_K: tl.constexpr, RENORM: tl.constexpr, BLOCK_E: tl.constexpr):
    """One token's softmax over its router logits (float32), top-k and optional renormalisation."""
    t = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, BLOCK_E)
    e_ok = experts < E
    logits = tl.load(logits_ptr + t * stride_l + experts, mask=e_ok, other=float("-inf")).to(tl.float32)
    probs = tl.exp(logits - tl.max(logits, axis=0))
    probs = tl.where(e_ok, probs / tl.sum(probs, axis=0), -1.0)
    chosen_sum = 0.0
    remaining = probs
    for k in tl.static_range(TOP_K):  # the k-th largest (lowest index on ties, as torch.topk)
        best = tl.max(remaining, axis=0)
        # never past the last expert, even for NaN logits (no comparison holds): ids index weights
        index = tl.minimum(tl.min(tl.where(remaining == best, experts, BLOCK_E), axis=0), E - 1)
        tl.store(ids_ptr + t * TOP_K + k, index)
        tl.store(weights_ptr + t * TOP_K + k, best)
        chosen_sum += best
        remaining = tl.where(experts == index, -2.0, remaining)
    if RENORM:
        for k in tl.static_range(TOP_K):
            value = tl.load(weights_ptr + t * TOP_K + k)
            tl.store(weights_ptr + t * TOP_K + k, value / chosen_sum)


def route(x: torch.Tensor, gate_weight: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids [T, k] int32, weights [T, k] float32) of each token: the router's logits by
    the library matmul (in the stream's dtype, as the reference rounds them), then one small
    kernel a token for softmax, top-k and renormalisation."""
    T = x.shape[0]
    E = gate_weight.shape[0]
    ids = torch.empty(T, top_k, dtype=torch.int32, device=x.device)
    weights = torch.empty(T, top_k, dtype=torch.float32, device=x.device)
    if T:
        logits = torch.nn.functional.linear(x, gate_weight)
        _topk_kernel[(T,)](logits, ids, weights, E, logits.stride(0), TOP_K=top_k, RENORM=renormalize, BLOCK_E=triton.next_power_of_2(E))
    return ids, weights


@triton.jit
def _gemv_gate_up_kernel(x_ptr, w_ptr, ids_ptr, out_ptr, H: tl.constexpr, inter, top_k, stride_x, stride_we, stride_wn, stride_o,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pair = tl.program_id(0).to(tl.int64)
    token = pair // top_k
    e = tl.load(ids_ptr + pair).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = cols < inter
    gate = tl.zeros([BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_N], dtype=tl.float32)
    base = w_ptr + e * stride_we
    for k0 in range(0, H, BLOCK_K):
        offs = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs < H
        x = tl.load(x_ptr + token * stride_x + offs, mask=k_ok, other=0.0).to(tl.float32)
        mask = n_ok[:, None] & k_ok[None, :]
        wg = tl.load(base + cols[:, None] * stride_wn + offs[None, :], mask=mask, other=0.0).to(tl.float32)
        wu = tl.load(base + (cols[:, None] + inter) * stride_wn + offs[None, :], mask=mask, other=0.0).to(tl.float32)
        gate += tl.sum(wg * x[None, :], axis=1)
        up += tl.sum(wu * x[None, :], axis=1)
    dtype = out_ptr.dtype.element_ty
    g = gate.to(dtype).to(tl.float32)
    u = up.to(dtype).to(tl.float32)
    tl.store(out_ptr + pair * stride_o + cols, (g * tl.sigmoid(g) * u).to(dtype), mask=n_ok)


@triton.jit
def _gemv_down_kernel(a_ptr, w_ptr, ids_ptr, weights_ptr, out_ptr, H, inter: tl.constexpr, stride_a, stride_we, stride_wn, stride_o,
                      TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = cols < H
    total = tl.zeros([BLOCK_N], dtype=tl.float32)
    dtype = out_ptr.dtype.element_ty
    for j in tl.static_range(TOP_K):
        pair = token * TOP_K + j
        e = tl.load(ids_ptr + pair).to(tl.int64)
        base = w_ptr + e * stride_we
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for k0 in range(0, inter, BLOCK_K):
            offs = k0 + tl.arange(0, BLOCK_K)
            k_ok = offs < inter
            a = tl.load(a_ptr + pair * stride_a + offs, mask=k_ok, other=0.0).to(tl.float32)
            w = tl.load(base + cols[:, None] * stride_wn + offs[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(w * a[None, :], axis=1)
        total += acc.to(dtype).to(tl.float32) * tl.load(weights_ptr + pair)
    tl.store(out_ptr + token * stride_o + cols, total.to(dtype), mask=n_ok)


def align(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pairs sorted by expert, each expert's run padded to whole blocks of ``block_m``: (pair
    index per sorted row, ``pairs`` where padding), (expert of each block), (rows in use [1]).
    Fixed-size torch ops only: no host sync, capturable in a CUDA graph."""
    flat = ids.reshape(-1).long()
    pairs = flat.numel()
    device = flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    first = counts.cumsum(0) - counts
    dest = (ends - padded)[sorted_experts] + torch.arange(pairs, device=device) - first[sorted_experts]
    length = triton.cdiv(pairs + min(num_experts, pairs) * (block_m - 1), block_m) * block_m
    rows = torch.full((length,), pairs, dtype=torch.int64, device=device)
    rows[dest] = order
    block_expert = torch.searchsorted(ends, torch.arange(0, length, block_m, device=device), right=True).clamp_(max=num_experts - 1)
    return rows, block_expert, ends[-1:]


@triton.jit
def _grouped_kernel(a_ptr, w_ptr, out_ptr, rows_ptr, block_expert_ptr, used_ptr, weights_ptr,
                    pairs, a_rows_per_pair, N, K: tl.constexpr, half, stride_a, stride_we, stride_wn, stride_o,
                    GATED: tl.constexpr, WEIGHTED: tl.constexpr, PRECISION: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Block ``b`` of sorted pairs times its expert: out[pair, cols] = a[pair // a_rows_per_pair] @
    W[e][cols]^T; gated: silu(a @ W[cols]) * (a @ W[cols + half]); weighted: times the pair's weight."""
    b = tl.program_id(0)
    if b * BLOCK_M >= tl.load(used_ptr):
        return
    e = tl.load(block_expert_ptr + b).to(tl.int64)
    pair = tl.load(rows_ptr + b * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pair < pairs
    src = pair // a_rows_per_pair
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    base = w_ptr + e * stride_we
    for k0 in range(0, K, BLOCK_K):
        offs = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs < K
        a = tl.load(a_ptr + src[:, None] * stride_a + offs[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
        mask = k_ok[:, None] & n_ok[None, :]
        w = tl.load(base + cols[None, :] * stride_wn + offs[:, None], mask=mask, other=0.0)
        acc = tl.dot(a, w, acc, input_precision=PRECISION)
        if GATED:
            w2 = tl.load(base + (cols[None, :] + half) * stride_wn + offs[:, None], mask=mask, other=0.0)
            acc2 = tl.dot(a, w2, acc2, input_precision=PRECISION)
    dtype = out_ptr.dtype.element_ty
    if GATED:
        g = acc.to(dtype).to(tl.float32)
        u = acc2.to(dtype).to(tl.float32)
        result = g * tl.sigmoid(g) * u
    else:
        result = acc.to(dtype).to(tl.float32)
        if WEIGHTED:
            result = result * tl.load(weights_ptr + pair, mask=valid, other=0.0)[:, None]
    tl.store(out_ptr + pair[:, None] * stride_o + cols[None, :], result.to(dtype), mask=valid[:, None] & n_ok[None, :])


def experts_forward(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                    tiles: dict | None = None) -> torch.Tensor:
    """sum over a token's experts of weight * down(silu(gate(x)) * up(x)): x [T, H] -> [T, H].
    ``tiles`` overrides the kernels' tile sizes (``TILES``' keys), for tuning."""
    t = {**TILES, **(tiles or {})}
    T, H = x.shape
    E, two_i, _ = gate_up.shape
    inter = two_i // 2
    top_k = ids.shape[1]
    pairs = T * top_k
    if T == 0:
        return torch.empty(T, H, dtype=x.dtype, device=x.device)
    x = x.contiguous()
    act = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)
    if pairs <= t["gemv_max_pairs"]:
        out = torch.empty(T, H, dtype=x.dtype, device=x.device)
        _gemv_gate_up_kernel[(pairs, triton.cdiv(inter, t["gemv_gate_up_n"]))](
            x, gate_up, ids, act, H, inter, top_k, x.stride(0), gate_up.stride(0), gate_up.stride(1), act.stride(0),
            BLOCK_N=t["gemv_gate_up_n"], BLOCK_K=t["gemv_k"], num_warps=t["gemv_warps"])
        _gemv_down_kernel[(T, triton.cdiv(H, t["gemv_down_n"]))](
            act, down, ids, weights, out, H, inter, act.stride(0), down.stride(0), down.stride(1), out.stride(0),
            TOP_K=top_k, BLOCK_N=t["gemv_down_n"], BLOCK_K=t["gemv_k"], num_warps=t["gemv_warps"])
        return out
    block_m = t["grouped_m_small"] if pairs <= 1024 else t["grouped_m"]
    # float32 stays float32 on the tensor cores (no TF32 rounding of the inputs)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    rows, block_expert, used = align(ids, E, block_m)
    blocks = rows.numel() // block_m
    block_n, block_k = t["grouped_n"], t["grouped_k"]
    _grouped_kernel[(blocks, triton.cdiv(inter, block_n))](x, gate_up, act, rows, block_expert, used, weights, pairs, top_k, inter, H, inter,
                                                        x.stride(0), gate_up.stride(0), gate_up.stride(1), act.stride(0),
                                                        GATED=True, WEIGHTED=False, PRECISION=precision, BLOCK_M=block_m, BLOCK_N=block_n,
                                                        BLOCK_K=block_k, num_warps=t["grouped_warps"])
    per_pair = torch.empty(pairs, H, dtype=x.dtype, device=x.device)
    _grouped_kernel[(blocks, triton.cdiv(H, block_n))](act, down, per_pair, rows, block_expert, used, weights, pairs, 1, H, inter, 0,
                                                        act.stride(0), down.stride(0), down.stride(1), per_pair.stride(0),
                                                        GATED=False, WEIGHTED=True, PRECISION=precision, BLOCK_M=block_m, BLOCK_N=block_n,
                                                        BLOCK_K=block_k, num_warps=t["grouped_warps"])
    return per_pair.view(T, top_k, H).sum(1, dtype=torch.float32).to(x.dtype)
