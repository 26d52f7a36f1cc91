"""What a kernel boundary costs inside a decode step, on one GPU.

1. A chain of trivial kernels (each program reads one value its twin wrote in the kernel before,
   then writes one), captured in a CUDA graph: microseconds per kernel with and without
   programmatic dependent launch. This is the floor of every boundary of a decode layer.
2. The same hand-off inside one persistent kernel, separated by grid-wide barriers (an atomic
   counter per barrier): microseconds per barrier, and a check that every value arrived.

    python benchmarks/kernel_boundary_gpu.py
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from engine_gpu import time_cuda_ms  # beside this script

CHAIN = 96


@triton.jit
def _hand_off_kernel(src_ptr, dst_ptr, PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    pid = tl.program_id(0)
    tl.store(dst_ptr + pid, tl.load(src_ptr + pid) + 1)


@triton.jit
def _barrier_rounds_kernel(values_ptr, counter_ptr, rounds):
    """Each round a program reads what its neighbour wrote the round before, adds one, writes its
    own slot of the next round, and waits at a grid barrier."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for r in range(rounds):
        prev = tl.load(values_ptr + r * programs + (pid + 1) % programs, cache_modifier=".cg")
        tl.store(values_ptr + (r + 1) * programs + pid, prev + 1)
        tl.debug_barrier()
        tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
        target = (r + 1) * programs
        while tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu") < target:
            pass


def chain_us(programs: int, pdl: bool) -> float:
    bufs = [torch.zeros(programs, dtype=torch.int32, device="cuda") for _ in range(2)]

    def run():
        for i in range(CHAIN):
            _hand_off_kernel[(programs,)](bufs[i % 2], bufs[(i + 1) % 2], PDL=pdl, launch_pdl=pdl, num_warps=4)

    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return time_cuda_ms(graph.replay, iters=20) * 1e3 / CHAIN


def barrier_us(programs: int, rounds: int = CHAIN) -> tuple[float, bool]:
    values = torch.zeros((rounds + 1) * programs, dtype=torch.int32, device="cuda")
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")

    def run():
        counter.zero_()
        _barrier_rounds_kernel[(programs,)](values, counter, rounds, num_warps=4)

    run()
    torch.cuda.synchronize()
    ok = bool((values.view(rounds + 1, programs)[-1] == rounds).all())
    empty = time_cuda_ms(lambda: counter.zero_(), iters=50)
    return (time_cuda_ms(run, iters=20) - empty) * 1e3 / rounds, ok


def main() -> None:
    print("| programs | PDL | us per kernel boundary |")
    print("| --- | --- | --- |")
    for programs in (132, 264):
        for pdl in (False, True):
            print(f"| {programs} | {'on' if pdl else 'off'} | {chain_us(programs, pdl):.2f} |", flush=True)
    print("\n| programs | us per grid barrier | values arrived |")
    print("| --- | --- | --- |")
    for programs in (16, 132):
        us, ok = barrier_us(programs)
        print(f"| {programs} | {us:.2f} | {ok} |", flush=True)


if __name__ == "__main__":
    main()
