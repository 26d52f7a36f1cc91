"""Fused Triton kernels for the decoder backbones' CUDA path (and one CUDA C++ kernel compiled at
run time, ``decode_step``: a whole batch-1 decode forward, opt-in).

Each kernel has a torch reference in ``omni_core.models.layers`` / ``attention`` (the CPU path);
the models call these only when their attention backend asks for fused ops (``TritonPagedBackend``),
which the engine picks by default on CUDA when ``triton`` imports. Under ``TRITON_INTERPRET=1``
the same kernels run on CPU tensors (how the tests check them without a GPU).

Importing this package does not import triton; the kernel modules do, on first use.
"""

from __future__ import annotations

import functools
import os


@functools.cache
def triton_unavailable_reason() -> str | None:
    """None when triton imports, else why not."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as exc:  # an ImportError, or a broken install raising anything at import
        return f"triton does not import: {exc}"
    return None


def triton_available() -> bool:
    return triton_unavailable_reason() is None


def rms_norm(x, weight, eps, residual=None):
    """RMSNorm of ``x`` (or, with ``residual``, of ``x + residual``: returns (normed, x + residual))."""
    from omni_core.models.kernels.fused_norm import rms_norm as impl

    return impl(x, weight, eps, residual)


def silu_mul(gate_up):
    """silu(gate) * up for ``gate_up`` = [..., 2I] holding gate then up."""
    from omni_core.models.kernels.gated_activation import silu_mul as impl

    return impl(gate_up)


def rotary_store_kv(q, k, v, cos, sin, k_cache, v_cache, slot_mapping):
    """Rotates q and k in place and writes k and v into the paged cache at ``slot_mapping``."""
    from omni_core.models.kernels.rotary_cache import rotary_store_kv as impl

    impl(q, k, v, cos, sin, k_cache, v_cache, slot_mapping)


def argmax(logits, copy_to=None, host_out=None, turn=None):
    """``logits.argmax(dim=-1)`` of [N, V] logits (the first index on ties), also stored into
    ``copy_to`` and into row ``turn`` of pinned ``host_out`` when given; see ``kernels.greedy``."""
    from omni_core.models.kernels.greedy import argmax as impl

    return impl(logits, copy_to, host_out, turn)


def paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, block_size, scale, num_splits=None):
    """One query token per sequence against its paged KV history; see ``paged_attention``."""
    from omni_core.models.kernels.paged_attention import paged_decode_attention as impl

    return impl(q, k_cache, v_cache, block_tables, context_lens, block_size, scale, num_splits)


# decode rows up to this many run the fused linear kernels below; with more, torch's matmuls
# (tensor cores) plus the separate norm / activation / rotary kernels were faster on the H200
# (benchmarks/fused_linear_gpu.py: at 4 rows the gate/up projection took 16 us fused vs 7 us)
SKINNY_MAX_ROWS = 2


def skinny_linear(x, weight, bias=None, residual=None, norm_weight=None, eps=0.0):
    """``x @ weight^T + bias`` for few rows, optionally after (residual add +) RMSNorm; see ``kernels.fused_linear``."""
    from omni_core.models.kernels.fused_linear import linear as impl

    return impl(x, weight, bias, residual, norm_weight, eps)


def skinny_gated_linear(x, gate_up_weight, residual=None, norm_weight=None, eps=0.0):
    """``silu(g) * u`` of ``[g, u] = x @ gate_up_weight^T`` for few rows, optionally after (residual add +) RMSNorm."""
    from omni_core.models.kernels.fused_linear import gated_linear as impl

    return impl(x, gate_up_weight, residual, norm_weight, eps)


def qkv_rotary_store(x, qkv_weight, bias, cos, sin, slot_mapping, k_cache, v_cache, num_heads, num_kv_heads, head_dim, residual=None, norm_weight=None,
                     eps=0.0, positions=None):
    """Attention input projection + rotary + paged-cache write of decode rows, in one kernel; returns q
    (with ``positions``, ``cos``/``sin`` are the whole tables)."""
    from omni_core.models.kernels.fused_linear import qkv_rotary_store as impl

    return impl(x, qkv_weight, bias, cos, sin, slot_mapping, k_cache, v_cache, num_heads, num_kv_heads, head_dim, residual, norm_weight, eps,
                positions=positions)


def decode_step_kernel(model, kv_caches, block_size, device):
    """The one-kernel batch-1 decode forward of ``model`` over ``kv_caches``, or None where it does
    not apply; see ``kernels.decode_step``."""
    from omni_core.models.kernels.decode_step import DecodeStepKernel

    return DecodeStepKernel.build(model, kv_caches, block_size, device)


DECODE_STEP_ENV = "OMNI_DECODE_STEP_KERNEL"


def decode_step_enabled() -> bool:
    """Whether ``OMNI_DECODE_STEP_KERNEL=1`` turns the one-kernel decode on (read on every build).
    Off by default: on the H200 it is still slower than the per-layer kernels (docs/benchmarks.md)."""
    return os.environ.get(DECODE_STEP_ENV, "0") == "1"


def fuses_qkv_rotary(head_dim: int) -> bool:
    """Whether ``qkv_rotary_store`` handles this head size (its column tiles split each half of a head)."""
    return head_dim % 8 == 0


__all__ = [
    "DECODE_STEP_ENV", "SKINNY_MAX_ROWS", "argmax", "decode_step_enabled", "decode_step_kernel", "fuses_qkv_rotary", "paged_decode_attention",
    "qkv_rotary_store", "rms_norm", "rotary_store_kv", "silu_mul", "skinny_gated_linear", "skinny_linear", "triton_available",
    "triton_unavailable_reason",
]
