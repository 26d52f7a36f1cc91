"""The dtype a Whisper stage runs in: the ``dtype`` option resolved for the stage's device."""

from __future__ import annotations

import torch

from omni_whisper.cpu_features import cpu_has_native_bf16, cpu_has_vnni
from omni_whisper.int8 import int8_supported

DTYPES = ("auto", "float32", "float16", "bfloat16", "int8")


def check_dtype(name: str) -> str:
    if name not in DTYPES:
        raise ValueError(f"whisper: dtype must be one of {', '.join(DTYPES)}, not {name!r}")
    return name


def resolve_dtype(name: str, device: str | torch.device = "cpu") -> str:
    """On a GPU, ``auto`` is float16 (Whisper's own GPU precision) and int8 is refused (PyTorch's
    dynamic int8 linear runs on CPUs). On a CPU, ``auto`` is int8 where the CPU has VNNI int8
    instructions (measured faster than bfloat16 at concurrency 1 and 16, same word error rate
    within a point), else bfloat16 where it has native bf16, else float32."""
    check_dtype(name)
    if torch.device(device).type != "cpu":
        if name == "int8":
            raise ValueError(f"whisper: dtype int8 runs on CPUs only; on {device} use float16, bfloat16 or float32")
        return "float16" if name == "auto" else name
    if name == "auto":
        if int8_supported()[0] and cpu_has_vnni():
            return "int8"
        return "bfloat16" if cpu_has_native_bf16() else "float32"
    if name == "int8":
        supported, reason = int8_supported()
        if not supported:
            raise ValueError(f"whisper: dtype int8 is not available here: {reason}")
    return name
