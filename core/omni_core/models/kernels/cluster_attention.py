"""The attention half of a one-sequence decode layer in one CUDA kernel of thread-block clusters
(``cluster_attention.cu``): (residual add +) RMSNorm, q/k/v projection, rotary, cache write,
paged attention and the combine of its spans.

At one sequence the fused Triton path runs that as three dependent kernels (q/k/v, attention,
combine), and their boundaries, not their bytes, are what they cost: 3.6 MB of a 0.5B layer's
30 MB, 7.5 us of its 16. Here one cluster per KV head does it all: its blocks split the head
group's q/k/v columns and the context's tokens, pass q and the new K/V through distributed
shared memory and wait for each other at cluster barriers, which the hardware keeps.

It applies to bf16 weights and caches on Hopper GPUs, head size 64, hidden sizes a multiple of
128, where NVRTC and the driver library load; elsewhere ``cluster_attention`` returns None and
the caller keeps the Triton kernels. ``TritonPagedBackend.cluster_attention`` decides whether it
runs (``OMNI_CLUSTER_ATTENTION``).
"""

from __future__ import annotations

import ctypes
import functools
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from omni_core.models.kernels import cuda_rtc
from omni_core.models.kernels.launch import launch_options

log = logging.getLogger(__name__)

THREADS = 256
CLUSTER_SIZES = (16, 8)  # blocks a cluster, the first the device holds enough of (16 needs the non-portable opt-in)
MAX_QKV_ROWS_PER_WARP = 10  # q/k/v rows a warp holds in registers (at 16 a cluster a 0.5B model's warp takes 5)
SOURCE = Path(__file__).with_name("cluster_attention.cu")


@dataclass(frozen=True)
class AttentionShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    kv_block: int
    has_bias: bool
    has_residual: bool
    rope_bf16: bool = True  # the rotary tables' dtype (else float32)

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    def rows_per_warp(self, cluster: int) -> int:
        """q/k/v rows a warp holds at most: a block's share of the group's column pairs, two rows each."""
        units = (self.group + 2) * (self.head_dim // 2)
        return -(-2 * -(-units // cluster) // (THREADS // 32))

    def unsupported(self, cluster: int) -> str | None:
        if self.head_dim != 64:
            return f"head size {self.head_dim} (the kernel takes 64)"
        if self.hidden % 128 or self.heads % self.kv_heads:
            return f"hidden {self.hidden}: needs a multiple of 128"
        if self.group > 16:
            return f"{self.group} query heads a KV head (at most 16)"
        if self.rows_per_warp(cluster) > MAX_QKV_ROWS_PER_WARP:
            return f"a block's q/k/v rows do not fit its registers ({self.rows_per_warp(cluster)} a warp)"
        return None


class _Params(ctypes.Structure):  # mirrors ``struct Params`` in cluster_attention.cu
    _fields_ = [
        ("x", ctypes.c_void_p), ("residual", ctypes.c_void_p), ("residual_out", ctypes.c_void_p), ("norm", ctypes.c_void_p),
        ("qkv", ctypes.c_void_p), ("qkv_bias", ctypes.c_void_p), ("cos_table", ctypes.c_void_p), ("sin_table", ctypes.c_void_p),
        ("positions", ctypes.c_void_p), ("slots", ctypes.c_void_p), ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p),
        ("block_table", ctypes.c_void_p), ("context_lens", ctypes.c_void_p), ("out", ctypes.c_void_p),
        ("eps", ctypes.c_float), ("scale", ctypes.c_float), ("profile", ctypes.c_void_p),
    ]


@functools.cache
def _compiled(shape: AttentionShape, cluster: int, arch: str, profile: bool = False) -> bytes:
    defines = {
        "HIDDEN": shape.hidden, "HEADS": shape.heads, "KV_HEADS": shape.kv_heads, "HEAD_DIM": shape.head_dim, "KV_BLOCK": shape.kv_block,
        "HAS_BIAS": int(shape.has_bias), "HAS_RESIDUAL": int(shape.has_residual), "ROPE_BF16": int(shape.rope_bf16), "THREADS": THREADS, "CLUSTER": cluster,
        "A_ROWS": shape.rows_per_warp(cluster), "PROFILE": int(profile),
    }
    return cuda_rtc.compile_kernel(SOURCE, defines, arch)


class ClusterAttentionKernel:
    """The kernel of one shape on one device, at the largest cluster size that fits a cluster per KV head at once."""

    def __init__(self, shape: AttentionShape, device: torch.device, profile: bool = False):
        self.shape = shape
        self.dependent = launch_options(device)  # programmatic dependent launch (else it waits its turn)
        arch = cuda_rtc.device_arch(device)
        reasons = []
        for cluster in CLUSTER_SIZES:
            reason = shape.unsupported(cluster)
            if reason is None:
                kernel = cuda_rtc.CudaKernel(_compiled(shape, cluster, arch, profile), "cluster_attention", device)
                grid = shape.kv_heads * cluster
                try:
                    fits = kernel.max_active_clusters(grid, THREADS, cluster)
                except cuda_rtc.CudaRtcError as exc:  # a size the device does not take
                    fits, reason = 0, f"clusters of {cluster}: {exc}"
                if fits >= shape.kv_heads:
                    self.kernel, self.cluster, self.grid = kernel, cluster, grid
                    self.launches = 0  # launched from the host (a graph's replays not counted)
                    # with ``profile``: each block's ten stamps of the last launch (ns; cluster_attention.cu's STAMP points)
                    self.stamps = torch.zeros(grid, 10, dtype=torch.int64, device=device) if profile else None
                    return
                reason = reason or f"{shape.kv_heads} clusters of {cluster} do not fit at once"
            reasons.append(reason)
        raise cuda_rtc.CudaRtcError("; ".join(reasons))

    def __call__(self, x, residual, norm_weight, eps, qkv_weight, bias, cos, sin, positions, slots, k_cache, v_cache, block_table,
                 context_lens) -> tuple[torch.Tensor, torch.Tensor]:
        shape = self.shape
        out = torch.empty(1, shape.heads * shape.head_dim, dtype=x.dtype, device=x.device)
        residual_out = torch.empty_like(x) if residual is not None else x
        params = _Params(
            x.data_ptr(), residual.data_ptr() if residual is not None else None, residual_out.data_ptr() if residual is not None else None,
            norm_weight.data_ptr(), qkv_weight.data_ptr(), bias.data_ptr() if bias is not None else None, cos.data_ptr(), sin.data_ptr(),
            positions.data_ptr(), slots.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_table.data_ptr(), context_lens.data_ptr(),
            out.data_ptr(), eps, shape.head_dim**-0.5, self.stamps.data_ptr() if self.stamps is not None else None,
        )
        self.kernel.launch(self.grid, THREADS, params, dependent=self.dependent, cluster=self.cluster)
        self.launches += 1
        return out, residual_out


@functools.cache
def kernel_for(shape: AttentionShape, device: torch.device) -> ClusterAttentionKernel | None:
    """The kernel of ``shape`` on ``device`` (built once), or None where it does not apply."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] != 9:
        reason = "the kernel is built for Hopper GPUs"
    else:
        try:
            return ClusterAttentionKernel(shape, device)
        except cuda_rtc.CudaRtcError as exc:
            reason = str(exc)
    log.info("decode attention keeps the Triton kernels: %s", reason)
    return None


def cluster_attention(x, residual, norm_weight, eps, qkv_weight, bias, cos, sin, positions, slots, k_cache, v_cache, block_tables, context_lens,
                      num_heads, num_kv_heads, head_dim, block_size) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(attention output [1, heads * head_dim], x + residual)`` of one decode row (``residual``
    None: the output and x), its K/V written to the caches at ``slots``; ``cos``/``sin``: the
    [positions, head_dim] tables (bf16 or float32). None where the kernel does not apply (the caller's
    other path then runs)."""
    bf16 = (x, norm_weight, qkv_weight, k_cache, v_cache) + ((residual,) if residual is not None else ()) + ((bias,) if bias is not None else ())
    if x.shape[0] != 1 or any(t.dtype != torch.bfloat16 or not t.is_contiguous() for t in bf16):
        return None
    if cos.dtype not in (torch.bfloat16, torch.float32) or sin.dtype != cos.dtype or not cos.is_contiguous() or not sin.is_contiguous():
        return None
    if k_cache.dim() != 3 or k_cache.stride() != v_cache.stride():
        return None
    if any(t.dtype != torch.int64 for t in (positions, slots, block_tables, context_lens)) or not block_tables.is_contiguous():
        return None
    shape = AttentionShape(x.shape[1], num_heads, num_kv_heads, head_dim, block_size, bias is not None, residual is not None, cos.dtype == torch.bfloat16)
    built = kernel_for(shape, x.device)
    if built is None:
        return None
    return built(x, residual, norm_weight, eps, qkv_weight, bias, cos, sin, positions, slots, k_cache, v_cache, block_tables, context_lens)
