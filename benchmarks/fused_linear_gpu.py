"""The fused decode-row kernels (``omni_core.models.kernels.fused_linear``) against the torch ops
they replace, one Qwen2-0.5B-shaped projection at a time (hidden 896, 14/2 heads of 64, FFN 4864,
bf16), at a few row counts.

Each variant runs 24 times back to back inside one CUDA graph (as the layers of a decode step
do) and the graph is replayed; the table gives microseconds per call and the weight bytes read
per second. ``--block-n`` and ``--warps`` sweep the column tile and warps of the fused kernels.

    python benchmarks/fused_linear_gpu.py [--rows 1 2 4 8] [--block-n 4 8 16] [--warps 4 8]

``OMNI_PDL=0`` runs the fused kernels without programmatic dependent launch.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from engine_gpu import time_cuda_ms  # beside this script
from omni_core.models import kernels
from omni_core.models.kernels import fused_linear, launch

HIDDEN, INTER, HEADS, KV_HEADS, DIM = 896, 4864, 14, 2, 64
CALLS = 24


def graph_us(fn) -> float:
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    return time_cuda_ms(graph.replay, iters=20) * 1e3 / CALLS


def cases(rows: int, w: dict[str, torch.Tensor], k_cache: torch.Tensor, v_cache: torch.Tensor) -> dict:
    """{projection: (torch ops, fused(block_n, num_warps), weight bytes)} at ``rows`` rows."""
    dev, dt = w["norm"].device, w["norm"].dtype
    x, residual = torch.randn(2, rows, HIDDEN, device=dev, dtype=dt)
    cos, sin = torch.randn(2, rows, DIM, device=dev, dtype=dt)
    slots = torch.arange(rows, device=dev)
    attn_out = torch.randn(rows, HEADS * DIM, device=dev, dtype=dt)
    act = torch.randn(rows, INTER, device=dev, dtype=dt)

    def qkv_torch():
        normed, _ = kernels.rms_norm(x, w["norm"], 1e-6, residual)
        q, k, v = F.linear(normed, w["qkv"], w["qkv_bias"]).split([HEADS * DIM, KV_HEADS * DIM, KV_HEADS * DIM], dim=-1)
        kernels.rotary_store_kv(q.view(rows, HEADS, DIM), k.view(rows, KV_HEADS, DIM), v.view(rows, KV_HEADS, DIM), cos, sin, k_cache, v_cache, slots)

    def qkv_fused(block_n=None, num_warps=None):
        fused_linear.qkv_rotary_store(x, w["qkv"], w["qkv_bias"], cos, sin, slots, k_cache, v_cache, HEADS, KV_HEADS, DIM, residual, w["norm"], 1e-6,
                                      block_n=block_n, num_warps=num_warps)

    def gate_up_torch():
        normed, _ = kernels.rms_norm(x, w["norm"], 1e-6, residual)
        kernels.silu_mul(F.linear(normed, w["gate_up"]))

    def gate_up_fused(block_n=None, num_warps=None):
        fused_linear.gated_linear(x, w["gate_up"], residual, w["norm"], 1e-6, block_n=block_n, num_warps=num_warps)

    def o_fused(block_n=None, num_warps=None):
        fused_linear.linear(attn_out, w["o"], block_n=block_n, num_warps=num_warps)

    def down_fused(block_n=None, num_warps=None):
        fused_linear.linear(act, w["down"], block_n=block_n, num_warps=num_warps)

    return {
        "norm + qkv + rotary + cache write": (qkv_torch, qkv_fused, w["qkv"].numel() * 2),
        "o_proj": (lambda: F.linear(attn_out, w["o"]), o_fused, w["o"].numel() * 2),
        "norm + gate_up + SiLU gate": (gate_up_torch, gate_up_fused, w["gate_up"].numel() * 2),
        "down_proj": (lambda: F.linear(act, w["down"]), down_fused, w["down"].numel() * 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--block-n", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    args = parser.parse_args()
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    weights = {
        "qkv": torch.randn((HEADS + 2 * KV_HEADS) * DIM, HIDDEN, device=dev, dtype=dt) * 0.02,
        "qkv_bias": torch.randn((HEADS + 2 * KV_HEADS) * DIM, device=dev, dtype=dt) * 0.02,
        "o": torch.randn(HIDDEN, HEADS * DIM, device=dev, dtype=dt) * 0.02,
        "gate_up": torch.randn(2 * INTER, HIDDEN, device=dev, dtype=dt) * 0.02,
        "down": torch.randn(HIDDEN, INTER, device=dev, dtype=dt) * 0.02,
        "norm": torch.ones(HIDDEN, device=dev, dtype=dt),
    }
    k_cache, v_cache = torch.zeros(2, 4096, KV_HEADS, DIM, device=dev, dtype=dt)
    pdl = launch.launch_options(torch.device(dev))
    print(f"device: {torch.cuda.get_device_name()}; microseconds per call (weight GB/s), {CALLS} calls per graph; programmatic dependent launch {pdl}")
    tiles = [(b, w) for w in args.warps for b in args.block_n]
    print("| projection | rows | torch ops | fused (defaults) | " + " | ".join(f"tile {b}, {w} warps" for b, w in tiles) + " |")
    print("| --- " * (4 + len(tiles)) + "|")
    for rows in args.rows:
        for name, (ref, fused, nbytes) in cases(rows, weights, k_cache, v_cache).items():
            cells = []
            for fn in [ref, fused] + [(lambda b=b, w=w, fused=fused: fused(b, w)) for b, w in tiles]:
                try:
                    us = graph_us(fn)
                    cells.append(f"{us:.1f} ({nbytes / us / 1e3:.0f})")
                except Exception as exc:  # a tile that does not compile for this shape
                    cells.append(f"failed: {type(exc).__name__}")
            print(f"| {name} | {rows} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
