"""The gated MLP of one or two decode rows as two CUDA kernels whose weight streams into shared
memory before they wait for the kernel before them (``staged_mlp.cu``).

On the fused Triton path a decode layer is a chain of six kernels; the MLP's two (26 MB of a
0.5B model's 30 MB a layer) request their weight into registers as they launch, but only as many
of their programs as find room beside the attention kernels still running get to, so most of the
weight is read after the kernel before them ends. Here each kernel runs one block per
multiprocessor that hands its whole weight slice to the copy engine first (gate/up: 133 KB a
block, down_proj: 68 KB; both fit beside each other in a multiprocessor's shared memory), lets
the next kernel launch (programmatic dependent launch), and only then waits. The weight then
streams in while q/k/v, attention and o_proj run, and after its wait a block only multiplies.

It applies to bf16 weights on Hopper GPUs where both slices fit in shared memory together and
NVRTC and the driver library load; elsewhere ``staged_mlp`` returns None and the caller keeps the
Triton kernels. ``TritonPagedBackend.staged_mlp`` turns it on (``OMNI_STAGED_MLP=1``); it is off by
default: on the H200 the copies deliver about 18 GB/s a multiprocessor, so the weight is still
arriving when the wait ends, and the step was no faster at one row (docs/benchmarks.md).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from omni_core.models.kernels import cuda_rtc
from omni_core.models.kernels.launch import launch_options, multiprocessors

log = logging.getLogger(__name__)

THREADS = 256
MAX_ROWS = 2
PROFILE_ENV = "OMNI_STAGED_MLP_PROFILE"  # 1: kernels built with timer stamps (benchmarks/engine_gpu.py --staged-mlp-profile)
PROFILE_SLOTS = 64  # launches whose stamps are kept, in turn
SOURCE = Path(__file__).with_name("staged_mlp.cu")


@dataclass(frozen=True)
class MlpShape:
    hidden: int
    inter: int
    rows: int

    def layout(self, blocks: int) -> dict[str, int]:
        """Compile-time sizes and the shared-memory bytes a block of each kernel takes."""
        warps = THREADS // 32
        gu_rows = -(-self.inter // blocks)
        dn_rows = -(-self.hidden // blocks)
        gate_up = 128 + 2 * gu_rows * self.hidden * 2 + 4 * self.rows * (self.hidden + warps)
        down = 128 + dn_rows * self.inter * 2 + 4 * warps * dn_rows * self.rows
        return {"GU_ROWS": gu_rows, "DN_ROWS": dn_rows, "gate_up_shared": gate_up, "down_shared": down}

    def unsupported(self, blocks: int, block_limit: int, multiprocessor_limit: int) -> str | None:
        if self.hidden % 128 or self.inter % 8:
            return f"hidden {self.hidden}, intermediate {self.inter}: need multiples of 128 and 8"
        if not 1 <= self.rows <= MAX_ROWS:
            return f"{self.rows} rows (the kernels take 1 to {MAX_ROWS})"
        layout = self.layout(blocks)
        both = layout["gate_up_shared"] + layout["down_shared"]
        # down_proj's blocks must fit beside gate/up's to stream while gate/up waits (1 KB a block reserved)
        if max(layout["gate_up_shared"], layout["down_shared"]) > block_limit or both + 2048 > multiprocessor_limit:
            return f"the weight slices need {both} bytes of shared memory a multiprocessor, the device has {multiprocessor_limit}"
        return None


class _GateUpParams(ctypes.Structure):  # mirrors ``struct GateUpParams`` in staged_mlp.cu
    _fields_ = [
        ("x", ctypes.c_void_p), ("residual", ctypes.c_void_p), ("norm", ctypes.c_void_p), ("weight", ctypes.c_void_p),
        ("out", ctypes.c_void_p), ("residual_out", ctypes.c_void_p), ("eps", ctypes.c_float), ("profile", ctypes.c_void_p),
    ]


class _DownParams(ctypes.Structure):  # mirrors ``struct DownParams``
    _fields_ = [("act", ctypes.c_void_p), ("weight", ctypes.c_void_p), ("out", ctypes.c_void_p), ("profile", ctypes.c_void_p)]


class StagedMlpKernels:
    """The two kernels of one shape on one device. With ``profile``, launch i's blocks record four
    stamps each (start, wait over, weight in, done; ns) into ``stamps[i % PROFILE_SLOTS, kernel]``."""

    def __init__(self, shape: MlpShape, device: torch.device, blocks: int, profile: bool = False):
        self.shape = shape
        self.blocks = blocks
        self.dependent = launch_options(device)  # programmatic dependent launch (else each waits its turn)
        layout = shape.layout(blocks)
        defines = {"HIDDEN": shape.hidden, "INTER": shape.inter, "THREADS": THREADS, "ROWS": shape.rows,
                   "GU_ROWS": layout["GU_ROWS"], "DN_ROWS": layout["DN_ROWS"], "PROFILE": int(profile)}
        cubin = _compiled(tuple(defines.items()), cuda_rtc.device_arch(device))
        self.gate_up = cuda_rtc.CudaKernel(cubin, "staged_gate_up", device, layout["gate_up_shared"], max_shared_carveout=True)
        self.down = cuda_rtc.CudaKernel(cubin, "staged_down", device, layout["down_shared"], max_shared_carveout=True)
        if self.gate_up.blocks_per_multiprocessor(THREADS) < 1 or self.down.blocks_per_multiprocessor(THREADS) < 1:
            raise cuda_rtc.CudaRtcError("a staged MLP kernel does not fit on a multiprocessor")
        self.stamps = torch.zeros(PROFILE_SLOTS, 2, blocks, 4, dtype=torch.int64, device=device) if profile else None
        self.launches = 0

    def __call__(self, x, residual, norm_weight, eps: float, gate_up_weight, down_weight) -> tuple[torch.Tensor, torch.Tensor]:
        rows, hidden = x.shape
        act = torch.empty(rows, self.shape.inter, dtype=x.dtype, device=x.device)
        residual_out = torch.empty_like(x)
        out = torch.empty_like(x)
        stamps = (None, None)
        if self.stamps is not None:
            stamps = tuple(t.data_ptr() for t in self.stamps[self.launches % PROFILE_SLOTS])
            self.launches += 1
        self.gate_up.launch(self.blocks, THREADS, _GateUpParams(
            x.data_ptr(), residual.data_ptr(), norm_weight.data_ptr(), gate_up_weight.data_ptr(), act.data_ptr(), residual_out.data_ptr(), eps,
            stamps[0],
        ), dependent=self.dependent)
        self.down.launch(self.blocks, THREADS, _DownParams(act.data_ptr(), down_weight.data_ptr(), out.data_ptr(), stamps[1]), dependent=self.dependent)
        return out, residual_out


@functools.cache
def _compiled(defines: tuple[tuple[str, int], ...], arch: str) -> bytes:
    return cuda_rtc.compile_kernel(SOURCE, dict(defines), arch)


def kernels_for(shape: MlpShape, device: torch.device) -> StagedMlpKernels | None:
    """The kernels of ``shape`` on ``device`` (built once), or None where they do not apply."""
    return _kernels_for(shape, device, _profiling())


@functools.cache
def _profiling() -> bool:
    return os.environ.get(PROFILE_ENV) == "1"  # read once: kernels_for runs on every eager decode layer


@functools.cache
def _kernels_for(shape: MlpShape, device: torch.device, profile: bool) -> StagedMlpKernels | None:
    reason = unsupported_reason(shape, device)
    if reason is None:
        try:
            return StagedMlpKernels(shape, device, multiprocessors(device), profile)
        except cuda_rtc.CudaRtcError as exc:
            reason = str(exc)
    log.info("the decode MLP keeps the Triton kernels: %s", reason)
    return None


def unsupported_reason(shape: MlpShape, device: torch.device) -> str | None:
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] != 9:
        return "the kernels are built for Hopper GPUs"
    props = torch.cuda.get_device_properties(device)
    return shape.unsupported(multiprocessors(device), props.shared_memory_per_block_optin, props.shared_memory_per_multiprocessor)


def staged_mlp(x, residual, norm_weight, eps, gate_up_weight, down_weight) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(down(silu(g) * u), x + residual)`` with ``[g, u] = rms_norm(x + residual) @ gate_up^T``
    for x [rows, hidden] (rows 1-2), or None where the kernels do not apply (the caller's other
    path then runs)."""
    tensors = (x, residual, norm_weight, gate_up_weight, down_weight)
    if any(t.dtype != torch.bfloat16 or not t.is_contiguous() for t in tensors) or x.shape != residual.shape:
        return None
    built = kernels_for(MlpShape(x.shape[1], down_weight.shape[1], x.shape[0]), x.device)
    return None if built is None else built(x, residual, norm_weight, eps, gate_up_weight, down_weight)
