"""RMSNorm, optionally fused with the residual add before it: one read of each input, one write
of each output, float32 accumulation."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from omni_core.models.kernels.launch import launch_options


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr,
    stride_x, stride_residual, stride_out, stride_residual_out,
    n_cols, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:  # see kernels.launch
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0).to(tl.float32)
        # the sum is rounded to the stream's dtype first: later layers add to what is stored
        total = (x + r).to(residual_out_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * stride_residual_out + cols, total, mask=mask)
        x = total.to(tl.float32)
    mean_square = tl.sum(x * x, axis=0) / n_cols
    inv_rms = 1.0 / tl.sqrt(mean_square + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (x * inv_rms * w).to(out_ptr.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    rows = t.reshape(-1, t.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """``normed`` of x, or ``(normed, x + residual)`` of the sum; outputs are new tensors in x's dtype."""
    n = x.shape[-1]
    x2 = _rows(x)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    block = triton.next_power_of_2(n)
    warps = 4 if block <= 2048 else 8
    pdl = launch_options(x.device)
    if residual is None:
        _rms_norm_kernel[(x2.shape[0],)](x2, x2, weight, out, out, x2.stride(0), 0, out.stride(0), 0, n, eps, HAS_RESIDUAL=False, BLOCK=block, PDL=pdl, num_warps=warps, launch_pdl=pdl)
        return out.view(x.shape)
    r2 = _rows(residual)
    residual_out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    _rms_norm_kernel[(x2.shape[0],)](
        x2, r2, weight, out, residual_out, x2.stride(0), r2.stride(0), out.stride(0), residual_out.stride(0), n, eps,
        HAS_RESIDUAL=True, BLOCK=block, PDL=pdl, num_warps=warps, launch_pdl=pdl,
    )
    return out.view(x.shape), residual_out.view(x.shape)
