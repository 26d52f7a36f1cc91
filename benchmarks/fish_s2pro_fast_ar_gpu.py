"""The fish-s2pro fast AR of one slow step (codebooks 1..9 for every row of the step) at the `full`
preset's sizes (4 layers x 2560, bf16, random weights drawn on the GPU), launched kernel by kernel
against replayed from its CUDA graph (``omni_fish_s2pro.fast_ar_graphs``), the graph with the torch
layers and with the core's fused kernels (what the stage runs on CUDA), greedy and with the
stage's default sampling (temperature 0.8, top-p 0.8, top-k 30), at a few batch sizes.

Each number is the wall time of one call, host work included (launch-bound calls are decided on
the host), averaged over back-to-back calls ended by one synchronize.

    python benchmarks/fish_s2pro_fast_ar_gpu.py [--batch 1 8 32] [--iters 50]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from omni_core.scheduler.sampling_params import SamplingParams
from omni_fish_s2pro.checkpoint import load_fast_ar
from omni_fish_s2pro.config import load_config
from omni_fish_s2pro.dual_ar_stage import DEFAULT_SAMPLING
from omni_fish_s2pro.fast_ar_graphs import FastARGraphs
from omni_fish_s2pro.presets import write_full
from omni_fish_s2pro.sampling import StepSampler


def wall_ms(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / iters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    checkpoint = write_full(tempfile.mkdtemp(prefix="fish-s2pro-full-"))  # configs only: no weights written
    cfg = load_config(checkpoint)
    device = torch.device("cuda")
    fast = load_fast_ar(checkpoint, device, torch.bfloat16)
    sampling = StepSampler(device, cfg.num_codebooks)
    graphs = FastARGraphs(fast, sampling, cfg.slow.dim, torch.bfloat16)
    fused = FastARGraphs(fast, sampling, cfg.slow.dim, torch.bfloat16, fused=True)
    for g in (graphs, fused):
        g.capture(max(args.batch), [SamplingParams(**DEFAULT_SAMPLING)])
    print(f"{'batch':>5} {'sampling':>8} {'eager ms':>9} {'graph ms':>9} {'fused graph ms':>14} {'speed-up':>8}")
    for batch in args.batch:
        hidden = torch.randn(batch, cfg.slow.dim, device=device, dtype=torch.bfloat16)
        code0 = torch.randint(0, cfg.codebook_size, (batch,), device=device)
        seeds, done = list(range(batch)), [7] * batch
        for name, params in (("greedy", SamplingParams(temperature=0.0)), ("default", SamplingParams(**DEFAULT_SAMPLING))):
            rows = [params] * batch
            step = dict(hidden=hidden, code0=code0, rows=rows, seeds=seeds, done=done)
            eager = wall_ms(lambda s=step: fast(s["hidden"], s["code0"], sampling.fast_chooser(s["rows"], s["seeds"], s["done"])), args.iters)
            graph = wall_ms(lambda s=step: graphs(s["hidden"], s["code0"], s["rows"], s["seeds"], s["done"]), args.iters)
            fused_graph = wall_ms(lambda s=step: fused(s["hidden"], s["code0"], s["rows"], s["seeds"], s["done"]), args.iters)
            print(f"{batch:>5} {name:>8} {eager:>9.3f} {graph:>9.3f} {fused_graph:>14.3f} {eager / fused_graph:>7.1f}x")


if __name__ == "__main__":
    main()
