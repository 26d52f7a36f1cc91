"""Fused Triton kernels for the decoder backbones' CUDA path.

Each kernel has a torch reference in ``omni_core.models.layers`` / ``attention`` (the CPU path);
the models call these only when their attention backend asks for fused ops (``TritonPagedBackend``),
which the engine picks by default on CUDA when ``triton`` imports. Under ``TRITON_INTERPRET=1``
the same kernels run on CPU tensors (how the tests check them without a GPU).

Importing this package does not import triton; the kernel modules do, on first use.
"""

from __future__ import annotations

import functools


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


def paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, block_size, scale, num_splits=None):
    """One query token per sequence against its paged KV history; see ``paged_attention``."""
    from omni_core.models.kernels.paged_attention import paged_decode_attention as impl

    return impl(q, k_cache, v_cache, block_tables, context_lens, block_size, scale, num_splits)


__all__ = ["paged_decode_attention", "rms_norm", "rotary_store_kv", "silu_mul", "triton_available", "triton_unavailable_reason"]
