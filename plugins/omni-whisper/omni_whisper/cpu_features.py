"""What the CPU's instruction set offers, read once from /proc/cpuinfo (empty where it is absent)."""

from __future__ import annotations

import functools


@functools.cache
def cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as handle:
            return frozenset(handle.read().split())
    except OSError:
        return frozenset()


def cpu_has_native_bf16() -> bool:
    """bf16 matrix instructions (AVX512-BF16 or AMX): there bf16 runs about twice as fast as fp32."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def cpu_has_vnni() -> bool:
    """VNNI (AVX512-VNNI, AVX-VNNI or AMX) sums u8 x s8 products straight into int32."""
    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & cpu_flags())
