"""Linear layers for decode-sized batches (a few rows), fused with what surrounds them.

At decode shapes a linear layer only streams its weight once, and the time of the small kernels
around it (norm, activation, rotary, cache write) is mostly launch and ramp-up. One kernel here
does ``epilogue(prologue(x) @ W^T + b)``:

- prologue: nothing, RMSNorm, or residual add + RMSNorm (the add's sum is also written out,
  by the programs of the first column tile, as the residual stream);
- epilogue: store; SiLU gate (W holds gate rows then up rows, the output is ``silu(g) * u``);
  or rotary + paged-cache write (W holds q, k, v heads: q heads are rotated and stored, k heads
  rotated and written to the key cache at each row's slot, v heads written to the value cache).

A program owns ``BLOCK_N`` output columns (for the gate and rotary epilogues, that many pairs of
columns) for up to ``BLOCK_M`` rows and runs over K: each weight tile is loaded once and
multiplied with every row in registers (a matrix-unit tile would pad the rows to 16 and stage the
weight through shared memory, which halved the bandwidth a program got on the H200). Each
program recomputes the norm of its rows (K values per row, from L2): cheaper than a separate
kernel. It does so in the same pass as the products: RMSNorm(h) @ W^T is (h * w) @ W^T / rms(h),
so the row is read once, the sum of squares and the products are reduced together, and 1/rms
scales the finished products (the norm's output is not rounded to the weight's dtype as the
unfused norm rounds it: the results agree with a float32 norm to the output's rounding).

The weight does not depend on the previous kernel, so a program requests its first weight tile
(and the norm weight's) before anything else, and each next tile while it multiplies the current
one. On Hopper the kernels take part in programmatic dependent launch (``kernels.launch``): a
kernel lets the next one launch as soon as it starts (``early_launch``), so the next kernel's
weight requests go out while this one still runs, and only its reads of x wait for this one to
finish.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from omni_core.models.kernels import fuses_qkv_rotary
from omni_core.models.kernels.launch import launch_options, multiprocessors

PROLOGUE_NONE, PROLOGUE_NORM, PROLOGUE_ADD_NORM = 0, 1, 2
EPILOGUE_STORE, EPILOGUE_SILU_GATE, EPILOGUE_ROTARY_KV = 0, 1, 2
MAX_ROWS = 8  # rows one program multiplies with each weight tile (the engine uses these kernels up to 2)


@triton.jit
def _norm_tile(norm_w_ptr, offs_k, K):
    """The norm weight at ``offs_k`` as float32 (0 past K)."""
    return tl.load(norm_w_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)


@triton.jit
def _input_row(x_ptr, res_ptr, res_out_ptr, w, row, offs_k, M, K: tl.constexpr, stride_xm, stride_rm, stride_rom, out_dtype,
               PROLOGUE: tl.constexpr, WRITE_RESIDUAL):
    """Row ``row`` of the projection's input at ``offs_k`` as float32, and its sum of squares there.
    Without a prologue: x, rounded to the weight's dtype. With RMSNorm: the norm's input (x +
    residual, rounded to the stream's dtype as the unfused add stores it; the first column tile
    writes it out) times the norm weight ``w`` (``_norm_tile``), but not yet by 1/rms, which the
    caller applies to the finished products: so the norm's reduction and the products run in one
    pass over the row."""
    mask = (offs_k < K) & (row < M)
    x = tl.load(x_ptr + row * stride_xm + offs_k, mask=mask, other=0.0)
    if PROLOGUE == 0:
        return x.to(out_dtype).to(tl.float32), 0.0
    if PROLOGUE == 2:
        r = tl.load(res_ptr + row * stride_rm + offs_k, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        if WRITE_RESIDUAL:
            tl.store(res_out_ptr + row * stride_rom + offs_k, x, mask=mask)
    xf = x.to(tl.float32)
    return xf * w, tl.sum(xf * xf, axis=0)


@triton.jit
def _weight_tile(w_ptr, rows, valid, stride_wn, offs_k, K: tl.constexpr):
    mask = valid[:, None] & (offs_k < K)[None, :]
    return tl.load(w_ptr + rows[:, None].to(tl.int64) * stride_wn + offs_k[None, :], mask=mask, other=0.0)


@triton.jit
def _add_pair(a0, b0, a1, b1):
    """Sums two reductions at once (``tl.reduce`` over a pair of tensors)."""
    return a0 + a1, b0 + b1


@triton.jit
def _tile_product(acc_a, acc_b, sum_sq, wa, wb, offs_k, x_ptr, res_ptr, res_out_ptr, nw, pid_m, M, K: tl.constexpr, stride_xm, stride_rm,
                  stride_rom, write_residual, w_dtype, PROLOGUE: tl.constexpr, EPILOGUE: tl.constexpr, BLOCK_M: tl.constexpr):
    """acc += each row of the input (``_input_row``) at ``offs_k`` times the weight tile(s) ``wa``
    (and ``wb``), sum_sq += each row's sum of squares there; ``nw``: the norm weight at ``offs_k``."""
    row_ids = tl.arange(0, BLOCK_M)
    wa_f = wa.to(tl.float32)
    wb_f = wb.to(tl.float32)
    for m in tl.static_range(BLOCK_M):
        xr, sq = _input_row(x_ptr, res_ptr, res_out_ptr, nw, pid_m * BLOCK_M + m, offs_k, M, K, stride_xm, stride_rm, stride_rom, w_dtype,
                            PROLOGUE, write_residual)
        sum_sq += tl.where(row_ids == m, sq, 0.0)
        if EPILOGUE != 0:
            # both column sets' products in one reduction: one pass through shared memory and its
            # barriers, not two (on the H200: 3 us off a batch-1 step, 40 off a batch-2 step; the
            # same as one sum over the pair joined along a third axis took 30 us more at two rows)
            da, db = tl.reduce((wa_f * xr[None, :], wb_f * xr[None, :]), 1, _add_pair)
            acc_a += tl.where((row_ids == m)[:, None], da[None, :], 0.0)
            acc_b += tl.where((row_ids == m)[:, None], db[None, :], 0.0)
        else:
            acc_a += tl.where((row_ids == m)[:, None], tl.sum(wa_f * xr[None, :], axis=1)[None, :], 0.0)
    return acc_a, acc_b, sum_sq


@triton.jit
def _skinny_linear_kernel(
    x_ptr, res_ptr, norm_w_ptr, w_ptr, bias_ptr, out_ptr, res_out_ptr,
    cos_ptr, sin_ptr, pos_ptr, slot_ptr, k_cache_ptr, v_cache_ptr,
    M, K: tl.constexpr, n_cols, second_offset, eps,
    stride_xm, stride_rm, stride_rom, stride_wn, stride_om, stride_rope, stride_cache_slot, stride_cache_head,
    num_q_heads, num_kv_heads,
    PROLOGUE: tl.constexpr, EPILOGUE: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MAIN_K: tl.constexpr, TAIL_K: tl.constexpr,
    HALF: tl.constexpr, ROPE_BY_POSITION: tl.constexpr, PDL: tl.constexpr, EARLY_LAUNCH: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    # the W rows behind this program's columns: one set (store) or two (gate/up, rotary halves)
    if EPILOGUE == 2:
        pairs_per_head = HALF // BLOCK_N
        head = pid_n // pairs_per_head
        j = (pid_n % pairs_per_head) * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_a = head * (2 * HALF) + j
        rows_b = rows_a + HALF
        n_rows = (num_q_heads + 2 * num_kv_heads) * 2 * HALF
    else:
        rows_a = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_b = rows_a + second_offset
        n_rows = n_cols
    valid_a = rows_a < n_rows
    if PDL and EARLY_LAUNCH:  # the next kernel may launch now and request its own weight
        tl.extra.cuda.gdc_launch_dependents()
    # the weight does not depend on the previous kernel: its first tile (and the tail past the
    # whole tiles) is requested before the wait, and each step requests the next tile before
    # multiplying this one, so the weight stream never waits on x, the norm or the arithmetic
    offs_k = tl.arange(0, BLOCK_K)
    wa = _weight_tile(w_ptr, rows_a, valid_a, stride_wn, offs_k, MAIN_K)
    wb = wa
    if EPILOGUE != 0:
        wb = _weight_tile(w_ptr, rows_b, valid_a, stride_wn, offs_k, MAIN_K)
    # nor does the norm weight (read after the wait, it would put a round trip to memory between
    # the norm's reduction and the first product)
    nw = tl.zeros([BLOCK_K], tl.float32)
    if PROLOGUE != 0:
        nw = _norm_tile(norm_w_ptr, offs_k, MAIN_K)
    if TAIL_K > 0:  # a compile-time branch: offs_t, ta, tb and nt exist only with a tail
        offs_t = MAIN_K + tl.arange(0, TAIL_K)
        ta = _weight_tile(w_ptr, rows_a, valid_a, stride_wn, offs_t, K)
        if EPILOGUE != 0:
            tb = _weight_tile(w_ptr, rows_b, valid_a, stride_wn, offs_t, K)
        else:
            tb = ta
        nt = tl.zeros([TAIL_K], tl.float32)
        if PROLOGUE != 0:
            nt = _norm_tile(norm_w_ptr, offs_t, K)
    # nor do the bias, the rotary rows and the cache slots (written before the step's first kernel)
    m_mask = (offs_m < M)[:, None]
    bias_a = tl.zeros([BLOCK_N], tl.float32)
    bias_b = tl.zeros([BLOCK_N], tl.float32)
    if HAS_BIAS:
        bias_a = tl.load(bias_ptr + rows_a, mask=valid_a, other=0.0).to(tl.float32)
        if EPILOGUE != 0:
            bias_b = tl.load(bias_ptr + rows_b, mask=valid_a, other=0.0).to(tl.float32)
    if EPILOGUE == 2:
        rope_rows = offs_m
        if ROPE_BY_POSITION:  # cos/sin are whole tables: each row's position picks its row
            rope_rows = tl.load(pos_ptr + offs_m, mask=offs_m < M, other=0).to(tl.int64)
        rope = rope_rows[:, None] * stride_rope + j[None, :]
        # rounded to the stream's dtype, as the unfused path's table lookup is
        stream_ty = x_ptr.dtype.element_ty
        cos = tl.load(cos_ptr + rope, mask=m_mask, other=0.0).to(stream_ty).to(tl.float32)
        sin = tl.load(sin_ptr + rope, mask=m_mask, other=0.0).to(stream_ty).to(tl.float32)
        slot = tl.load(slot_ptr + offs_m, mask=offs_m < M, other=0).to(tl.int64)
    if PDL:
        tl.extra.cuda.gdc_wait()  # x (and the residual) come from the previous kernel

    acc_a = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_b = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    sum_sq = tl.zeros([BLOCK_M], tl.float32)
    for k0 in range(0, MAIN_K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        next_wa = wa
        next_wb = wb
        next_nw = nw
        if MAIN_K > BLOCK_K:  # more than one tile: request the next (all masked off after the last)
            next_wa = _weight_tile(w_ptr, rows_a, valid_a, stride_wn, offs_k + BLOCK_K, MAIN_K)
            if EPILOGUE != 0:
                next_wb = _weight_tile(w_ptr, rows_b, valid_a, stride_wn, offs_k + BLOCK_K, MAIN_K)
            if PROLOGUE != 0:
                next_nw = _norm_tile(norm_w_ptr, offs_k + BLOCK_K, MAIN_K)
        acc_a, acc_b, sum_sq = _tile_product(acc_a, acc_b, sum_sq, wa, wb, offs_k, x_ptr, res_ptr, res_out_ptr, nw, pid_m, M, K, stride_xm,
                                             stride_rm, stride_rom, pid_n == 0, w_ptr.dtype.element_ty, PROLOGUE, EPILOGUE, BLOCK_M)
        wa = next_wa
        wb = next_wb
        nw = next_nw
    if TAIL_K > 0:
        acc_a, acc_b, sum_sq = _tile_product(acc_a, acc_b, sum_sq, ta, tb, offs_t, x_ptr, res_ptr, res_out_ptr, nt, pid_m, M, K, stride_xm,
                                             stride_rm, stride_rom, pid_n == 0, w_ptr.dtype.element_ty, PROLOGUE, EPILOGUE, BLOCK_M)
    if PDL and not EARLY_LAUNCH:
        tl.extra.cuda.gdc_launch_dependents()  # the weight is read: the next kernel may launch
    if PROLOGUE != 0:  # the norm's 1/rms, left out of the products
        inv_rms = 1.0 / tl.sqrt(sum_sq / K + eps)
        acc_a *= inv_rms[:, None]
        acc_b *= inv_rms[:, None]
    if HAS_BIAS:
        acc_a += bias_a[None, :]
        acc_b += bias_b[None, :]
    out_ty = out_ptr.dtype.element_ty
    if EPILOGUE == 0:
        tl.store(out_ptr + offs_m[:, None] * stride_om + rows_a[None, :], acc_a.to(out_ty), mask=m_mask & valid_a[None, :])
    elif EPILOGUE == 1:
        # the unfused path rounds the matmul's output before the activation: so does this
        gate = acc_a.to(out_ty).to(tl.float32)
        up = acc_b.to(out_ty).to(tl.float32)
        act = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(out_ptr + offs_m[:, None] * stride_om + rows_a[None, :], act.to(out_ty), mask=m_mask & valid_a[None, :])
    else:
        lo = acc_a.to(out_ty).to(tl.float32)
        hi = acc_b.to(out_ty).to(tl.float32)
        if head < num_q_heads + num_kv_heads:  # q and k heads are rotated
            lo, hi = lo * cos - hi * sin, hi * cos + lo * sin
        if head < num_q_heads:
            q_ptr = out_ptr + offs_m[:, None] * stride_om + rows_a[None, :]
            tl.store(q_ptr, lo.to(out_ty), mask=m_mask)
            tl.store(q_ptr + HALF, hi.to(out_ty), mask=m_mask)
        else:
            if head < num_q_heads + num_kv_heads:
                cache_ptr = k_cache_ptr
                kv_head = head - num_q_heads
            else:
                cache_ptr = v_cache_ptr
                kv_head = head - num_q_heads - num_kv_heads
            dst = cache_ptr + slot[:, None] * stride_cache_slot + kv_head * stride_cache_head + j[None, :]
            cache_ty = cache_ptr.dtype.element_ty
            tl.store(dst, lo.to(cache_ty), mask=m_mask)
            tl.store(dst + HALF, hi.to(cache_ty), mask=m_mask)


def _block_m(m: int) -> int:
    return min(triton.next_power_of_2(m), MAX_ROWS)


def _block_k(K: int) -> int:
    """The K span of one weight tile: all of K up to 1024, 4096 from 4096 on, else 2048 (on the
    H200 at one row, o_proj and the 896-wide inputs ran fastest in one 1024 tile, down_proj
    (K 4864) in a 4096 tile and its tail)."""
    if K >= 4096:
        return 4096
    return min(triton.next_power_of_2(K), 2048)


def _k_tiles(K: int, block_k: int) -> tuple[int, int, int]:
    """(BLOCK_K, MAIN_K, TAIL_K): whole ``block_k`` tiles over the first MAIN_K of K, then a
    power-of-two tail tile for the rest (0: none), requested with the first tile before the wait.
    One tile at least as wide as K covers it all, masked."""
    if block_k >= K:
        return triton.next_power_of_2(K), K, 0
    rest = K % block_k
    return block_k, K - rest, triton.next_power_of_2(rest) if rest else 0


def _launch(x, weight, bias, out, *, prologue=PROLOGUE_NONE, residual=None, norm_weight=None, eps=0.0, residual_out=None,
            epilogue=EPILOGUE_STORE, columns: int, second_offset: int = 0, block_n: int,
            rotary=None, num_warps: int | None = None, block_k: int | None = None, early_launch: bool = True) -> None:
    M, K = x.shape
    if weight.stride(1) != 1 or x.stride(1) != 1:
        raise ValueError("x and the weight need unit stride along K")
    pdl = launch_options(x.device)
    dummy = out
    positions = None  # rotary rows given per row (or no rotary at all)
    if rotary is None:
        cos = sin = slots = k_cache = v_cache = dummy
        stride_rope = stride_slot = stride_head = 0
        q_heads = kv_heads = 0
        half = 16
        grid_n = triton.cdiv(columns, block_n)
    else:
        cos, sin, positions, slots, k_cache, v_cache, q_heads, kv_heads, head_dim = rotary
        half = head_dim // 2
        stride_rope, stride_slot, stride_head = cos.stride(0), k_cache.stride(0), k_cache.stride(1)
        grid_n = (q_heads + 2 * kv_heads) * (half // block_n)
    block_m = _block_m(M)
    # 4 warps where the tile names none: with the weight requested up front, the projections ran
    # fastest with 4 on the H200 (q/k/v at one row names 1)
    num_warps = num_warps or 4
    block_k, main_k, tail_k = _k_tiles(K, block_k or _block_k(K))
    _skinny_linear_kernel[(grid_n, triton.cdiv(M, block_m))](
        x, residual if residual is not None else x, norm_weight if norm_weight is not None else weight,
        weight, bias if bias is not None else weight, out, residual_out if residual_out is not None else out,
        cos, sin, dummy if positions is None else positions, slots, k_cache, v_cache,
        M, K, columns, second_offset, eps,
        x.stride(0), residual.stride(0) if residual is not None else 0, residual_out.stride(0) if residual_out is not None else 0,
        weight.stride(0), out.stride(0), stride_rope, stride_slot, stride_head,
        q_heads, kv_heads,
        PROLOGUE=prologue, EPILOGUE=epilogue, HAS_BIAS=bias is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, MAIN_K=main_k, TAIL_K=tail_k, HALF=half, ROPE_BY_POSITION=positions is not None,
        PDL=pdl, EARLY_LAUNCH=early_launch, num_warps=num_warps, launch_pdl=pdl,
    )


TILES_ENV = "OMNI_FUSED_TILES"


@functools.cache
def tile_override(role: str, K: int) -> tuple[int | None, int | None, int | None, bool | None]:
    """(block_n, num_warps, block_k, early_launch) that ``$OMNI_FUSED_TILES`` sets for a projection
    (None: the default), for tuning on another GPU without editing code; read once per process.
    The variable holds ``role=block_n,num_warps,block_k[,early_launch]`` entries separated by
    ``;``, role being ``qkv``, ``gate_up``, ``linear`` or ``linear<K>`` (a plain linear of that
    input size, e.g. ``linear4864``); 0 keeps a default size, and early launch is 0 or 1:
    ``OMNI_FUSED_TILES="linear4864=2,4,4096;gate_up=16,4,512,0"``."""
    entries = {}
    for entry in filter(None, os.environ.get(TILES_ENV, "").split(";")):
        name, _, values = entry.partition("=")
        try:
            entries[name.strip()] = [int(v) for v in values.split(",")]
        except ValueError:
            raise ValueError(f"{TILES_ENV}: cannot read {entry!r} (expected role=block_n,num_warps,block_k[,early_launch])") from None
    tile = entries.get(f"{role}{K}") if role == "linear" else None
    tile = tile or entries.get(role) or []
    sizes = [(tile[i] or None) if i < len(tile) else None for i in range(3)]
    return (*sizes, bool(tile[3]) if len(tile) > 3 else None)


def _tile(role: str, K: int, block_n, num_warps, block_k, early_launch):
    """The caller's tile where given, else ``$OMNI_FUSED_TILES``'s (``tile_override``)."""
    default = tile_override(role, K)
    early = early_launch if early_launch is not None else default[3]
    return block_n or default[0], num_warps or default[1], block_k or default[2], True if early is None else early


# Column tiles from the H200 at one and two rows (benchmarks/engine_gpu.py --ab in the engine:
# the projections of a step compete for multiprocessors, so they were tuned together, not one by
# one): a plain linear (o_proj, down_proj) ran fastest with two columns per program, q/k/v with
# one column pair in one warp at one row and four pairs in four warps at two (``_qkv_tile``),
# gate/up with 8 pairs at one row and 4 at two (``_gate_up_block_n``).
LINEAR_BLOCK_N = 2


def _qkv_tile(rows: int) -> tuple[int, int]:
    """(column pairs, warps) of a q/k/v program: one pair in one warp at one row (the products
    reduced inside the warp, no block-wide barrier after the wait: 4-7 us off a batch-1 step on the
    H200 against two pairs in four warps), four pairs in four warps from two rows (each pair count
    divides half of any head size ``fuses_qkv_rotary`` takes)."""
    return (1, 1) if rows == 1 else (4, 4)


def _gate_up_block_n(rows: int, columns: int, device: torch.device) -> int:
    """8 column pairs a program at one row (fewer if that left a multiprocessor under two
    programs), 4 from two rows on."""
    block = 8 if rows == 1 else 4
    while block > 4 and triton.cdiv(columns, block) < 2 * multiprocessors(device):
        block //= 2
    return block


def _prologue(residual, norm_weight):
    if norm_weight is None:
        return PROLOGUE_NONE
    return PROLOGUE_ADD_NORM if residual is not None else PROLOGUE_NORM


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, residual: torch.Tensor | None = None,
           norm_weight: torch.Tensor | None = None, eps: float = 0.0, block_n: int | None = None, num_warps: int | None = None,
           block_k: int | None = None, early_launch: bool | None = None):
    """``prologue(x) @ weight^T + bias`` for x [M, K]; with ``norm_weight``, the prologue is RMSNorm
    (of ``x + residual`` when given, and then returns ``(out, x + residual)``)."""
    M, K = x.shape
    N = weight.shape[0]
    block_n, num_warps, block_k, early_launch = _tile("linear", K, block_n, num_warps, block_k, early_launch)
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    residual_out = torch.empty_like(x) if residual is not None else None
    _launch(x, weight, bias, out, prologue=_prologue(residual, norm_weight), residual=residual, norm_weight=norm_weight, eps=eps,
            residual_out=residual_out, columns=N, block_n=block_n or LINEAR_BLOCK_N, num_warps=num_warps, block_k=block_k, early_launch=early_launch)
    return out if residual is None else (out, residual_out)


def gated_linear(x: torch.Tensor, gate_up_weight: torch.Tensor, residual: torch.Tensor | None = None,
                 norm_weight: torch.Tensor | None = None, eps: float = 0.0, block_n: int | None = None, num_warps: int | None = None,
                 block_k: int | None = None, early_launch: bool | None = None):
    """``silu(g) * u`` where ``[g, u] = prologue(x) @ gate_up_weight^T`` (gate rows first); the
    prologue and the return value as in ``linear``."""
    M, K = x.shape
    block_n, num_warps, block_k, early_launch = _tile("gate_up", K, block_n, num_warps, block_k, early_launch)
    inter = gate_up_weight.shape[0] // 2
    out = torch.empty(M, inter, dtype=x.dtype, device=x.device)
    residual_out = torch.empty_like(x) if residual is not None else None
    _launch(x, gate_up_weight, None, out, prologue=_prologue(residual, norm_weight), residual=residual, norm_weight=norm_weight,
            eps=eps, residual_out=residual_out, epilogue=EPILOGUE_SILU_GATE, columns=inter, second_offset=inter,
            block_n=block_n or _gate_up_block_n(M, inter, x.device), num_warps=num_warps, block_k=block_k, early_launch=early_launch)
    return out if residual is None else (out, residual_out)


def qkv_rotary_store(x: torch.Tensor, qkv_weight: torch.Tensor, bias: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                     slot_mapping: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int, num_kv_heads: int,
                     head_dim: int, residual: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None, eps: float = 0.0,
                     block_n: int | None = None, num_warps: int | None = None, block_k: int | None = None,
                     early_launch: bool | None = None, positions: torch.Tensor | None = None):
    """The attention input projection of decode rows: q = rotary(prologue(x) @ Wq^T + bq) is
    returned ([M, heads * head_dim]); k (rotated) and v go straight to the caches at
    ``slot_mapping``. ``cos``/``sin``: [M, head_dim] rows (halves repeated, as the table is), or
    with ``positions`` ([M]) the whole [max_positions, head_dim] tables, looked up in the kernel.
    With programmatic dependent launch the kernel reads the weight, bias, cos, sin, positions and
    slots before the previous kernel has finished: they must not be that kernel's outputs.
    With ``residual``, returns ``(q, x + residual)``."""
    M = x.shape[0]
    if k_cache.stride(2) != 1 or k_cache.stride() != v_cache.stride():
        raise ValueError("k_cache and v_cache must share one layout with unit stride along head_dim")
    cos2, sin2 = (cos, sin) if positions is not None else (cos.reshape(M, head_dim), sin.reshape(M, head_dim))
    if cos2.stride(-1) != 1 or sin2.stride(-1) != 1 or cos2.stride(0) != sin2.stride(0):
        cos2, sin2 = cos2.contiguous(), sin2.contiguous()
    q = torch.empty(M, num_heads * head_dim, dtype=x.dtype, device=x.device)
    residual_out = torch.empty_like(x) if residual is not None else None
    heads = num_heads + 2 * num_kv_heads
    if not fuses_qkv_rotary(head_dim):
        raise ValueError(f"head_dim {head_dim}: the fused projection needs a multiple of 8")
    block_n, num_warps, block_k, early_launch = _tile("qkv", x.shape[1], block_n, num_warps, block_k, early_launch)
    tile_n, tile_warps = _qkv_tile(M)
    block_n, num_warps = block_n or tile_n, num_warps or tile_warps  # pairs of columns, warps a program
    _launch(x, qkv_weight, bias, q, prologue=_prologue(residual, norm_weight), residual=residual, norm_weight=norm_weight, eps=eps,
            residual_out=residual_out, epilogue=EPILOGUE_ROTARY_KV, columns=heads * head_dim, block_n=block_n, num_warps=num_warps, block_k=block_k, early_launch=early_launch,
            rotary=(cos2, sin2, positions, slot_mapping, k_cache, v_cache, num_heads, num_kv_heads, head_dim))
    return q if residual is None else (q, residual_out)

