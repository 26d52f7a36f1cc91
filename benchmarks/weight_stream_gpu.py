"""How fast a decode layer's MLP weight (26 MB at the 0.5B shape) reaches the multiprocessors when
each block reads a fixed share of it, by how it is read: bulk copies into shared memory (one
thread a block, up to STAGES pieces of PIECE bytes in flight) or 16-byte loads into registers
(UNROLL in flight a thread), at one or more blocks a multiprocessor.

Each launch reads a fresh 26 MB region of a 2 GB buffer (not in L2, which holds 50 MB); 40
launches in a CUDA graph, replayed; microseconds a launch (a kernel boundary without programmatic
dependent launch, about 1 us, included) and TB/s; a configuration whose blocks do not fit a
multiprocessor together is listed as such (the register kernel is compiled for the blocks a
multiprocessor asked for, which caps its registers). The question it answers: whether one block a
multiprocessor, staging its share in shared memory, can read at the rate the Triton projections'
many programs reach (docs/experiments/2026-12-03-decode-kernel-fusions.md, "The MLP's weight staged in shared memory").

    python benchmarks/weight_stream_gpu.py
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
from engine_gpu import time_cuda_ms  # beside this script
from omni_core.models.kernels import cuda_rtc

SOURCE = Path(__file__).with_name("weight_stream_gpu.cu")
LAYER_BYTES = 3 * 4864 * 896 * 2  # gate/up and down_proj of a Qwen2-0.5B layer, bf16
BUFFER_BYTES = 2 << 30
LAUNCHES = 40
THREADS = 256
BULK = [  # (blocks a multiprocessor, stages, piece bytes)
    (1, 1, 32768), (1, 2, 32768), (1, 4, 32768), (1, 6, 32768), (1, 12, 16384), (1, 24, 8192), (1, 48, 4096),
    (2, 1, 32768), (2, 3, 32768), (2, 6, 16384),
]
# (blocks a multiprocessor, loads in flight a thread): at 8 blocks the 32 registers a thread left
# hold only 5 loads in flight (checked in the machine code), so 8 blocks take 2 and 4 only
REGISTERS = [(blocks, unroll) for blocks in (1, 2, 4) for unroll in (2, 4, 8)] + [(8, 2), (8, 4)]


class _StreamParams(ctypes.Structure):  # mirrors ``struct StreamParams`` in weight_stream_gpu.cu
    _fields_ = [("src", ctypes.c_void_p), ("share", ctypes.c_longlong), ("sink", ctypes.c_void_p)]


def kernel(name: str, defines: dict[str, int], shared: int, device: torch.device) -> cuda_rtc.CudaKernel:
    cubin = cuda_rtc.compile_kernel(SOURCE, {"THREADS": THREADS, "STAGES": 1, "PIECE": 16, "UNROLL": 1, "BLOCKS_PER_SM": 1, **defines},
                                    cuda_rtc.device_arch(device))
    return cuda_rtc.CudaKernel(cubin, name, device, shared)


def us_per_layer(k: cuda_rtc.CudaKernel, grid: int, share: int, buffer: torch.Tensor, sink: torch.Tensor) -> float:
    """Microseconds a launch of ``grid`` blocks reading ``share`` bytes each, each launch a new region."""
    region = -(-grid * share // 4096) * 4096
    params = [_StreamParams(buffer.data_ptr() + i * region, share, sink.data_ptr()) for i in range(LAUNCHES)]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for p in params[:2]:  # warm up outside the graph
            k.launch(grid, THREADS, p)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for p in params:
                k.launch(grid, THREADS, p)
    torch.cuda.synchronize()
    return time_cuda_ms(graph.replay, iters=10) * 1e3 / LAUNCHES


def row(device: torch.device, label: str, name: str, defines: dict[str, int], shared: int, blocks: int, step: int, in_flight: int,
        buffer: torch.Tensor, sink: torch.Tensor) -> None:
    """One table row: kernel ``name`` at ``blocks`` blocks a multiprocessor, each reading a whole
    number of ``step``-byte steps of the layer; or, where they do not fit a multiprocessor
    together, a row saying so."""
    k = kernel(name, defines, shared, device)
    resident = k.blocks_per_multiprocessor(THREADS)
    if resident < blocks:
        print(f"| {label} | {blocks} | - | only {resident} fit a multiprocessor | - |", flush=True)
        return
    grid = blocks * torch.cuda.get_device_properties(device).multi_processor_count
    share = LAYER_BYTES // grid // step * step
    us = us_per_layer(k, grid, share, buffer, sink)
    print(f"| {label} | {blocks} | {in_flight // 1024} KB | {us:.2f} | {grid * share / us / 1e6:.2f} |", flush=True)


def main() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    buffer = torch.randint(0, 255, (BUFFER_BYTES,), dtype=torch.uint8, device=device)
    sink = torch.zeros(max(b for b, *_ in BULK + REGISTERS) * sms, dtype=torch.int32, device=device)  # a word a block
    print(f"device: {torch.cuda.get_device_name()}, {sms} multiprocessors; {LAYER_BYTES / 1e6:.1f} MB a launch")
    print("| read | blocks a multiprocessor | in flight a block | us a launch | TB/s |")
    print("| --- | --- | --- | --- | --- |")
    for blocks, stages, piece in BULK:
        row(device, f"bulk copies into shared memory, {stages} x {piece // 1024} KB", "bulk_stream", {"STAGES": stages, "PIECE": piece},
            1024 + stages * piece, blocks, piece, stages * piece, buffer, sink)
    for blocks, unroll in REGISTERS:
        step = THREADS * unroll * 16  # every thread's loads unconditional, so all UNROLL go out together
        row(device, f"16-byte loads into registers, {unroll} a thread", "register_stream", {"UNROLL": unroll, "BLOCKS_PER_SM": blocks}, 0,
            blocks, step, step, buffer, sink)


if __name__ == "__main__":
    main()
