"""The fused decode-row kernels (``omni_core.models.kernels.fused_linear``) against the torch ops
they replace, one Qwen2-0.5B-shaped projection at a time (hidden 896, 14/2 heads of 64, FFN 4864,
bf16), at a few row counts.

Each variant runs 24 times back to back inside one CUDA graph (as the layers of a decode step
do) and the graph is replayed; the table gives microseconds per call and the weight bytes read
per second. Each call reads its own copy of the weight, as each layer does (a weight read again
would come from L2). ``--block-n``, ``--warps`` and ``--block-k`` sweep the column tile, the
warps and the K span of a weight tile of the fused kernels.

    python benchmarks/fused_linear_gpu.py [--rows 1 2 4 8] [--block-n 4 8 16] [--warps 4 8] [--block-k 0 1024 2048]

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
    """Microseconds per call of ``fn(layer)`` for layers 0..CALLS-1, captured in one CUDA graph."""
    for _ in range(2):
        fn(0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for layer in range(CALLS):
            fn(layer)
    return time_cuda_ms(graph.replay, iters=20) * 1e3 / CALLS


def cases(rows: int, w: dict[str, list[torch.Tensor]], k_cache: torch.Tensor, v_cache: torch.Tensor) -> dict:
    """{projection: (torch ops, fused, weight bytes)} at ``rows`` rows; each takes the layer whose
    weights it reads, the fused one also a tile (``block_n``, ``num_warps``, ``block_k``; None: defaults)."""
    dev, dt = k_cache.device, k_cache.dtype
    x, residual = torch.randn(2, rows, HIDDEN, device=dev, dtype=dt)
    cos, sin = torch.randn(2, rows, DIM, device=dev, dtype=dt)
    slots = torch.arange(rows, device=dev)
    attn_out = torch.randn(rows, HEADS * DIM, device=dev, dtype=dt)
    act = torch.randn(rows, INTER, device=dev, dtype=dt)
    norm = torch.ones(HIDDEN, device=dev, dtype=dt)

    def qkv_torch(layer):
        normed, _ = kernels.rms_norm(x, norm, 1e-6, residual)
        q, k, v = F.linear(normed, w["qkv"][layer], w["qkv_bias"][layer]).split([HEADS * DIM, KV_HEADS * DIM, KV_HEADS * DIM], dim=-1)
        kernels.rotary_store_kv(q.view(rows, HEADS, DIM), k.view(rows, KV_HEADS, DIM), v.view(rows, KV_HEADS, DIM), cos, sin, k_cache, v_cache, slots)

    def qkv_fused(layer, tile=None):
        fused_linear.qkv_rotary_store(x, w["qkv"][layer], w["qkv_bias"][layer], cos, sin, slots, k_cache, v_cache, HEADS, KV_HEADS, DIM,
                                      residual, norm, 1e-6, **(tile or {}))

    def gate_up_torch(layer):
        normed, _ = kernels.rms_norm(x, norm, 1e-6, residual)
        kernels.silu_mul(F.linear(normed, w["gate_up"][layer]))

    def gate_up_fused(layer, tile=None):
        fused_linear.gated_linear(x, w["gate_up"][layer], residual, norm, 1e-6, **(tile or {}))

    def o_fused(layer, tile=None):
        fused_linear.linear(attn_out, w["o"][layer], **(tile or {}))

    def down_fused(layer, tile=None):
        fused_linear.linear(act, w["down"][layer], **(tile or {}))

    return {
        "norm + qkv + rotary + cache write": (qkv_torch, qkv_fused, w["qkv"][0].numel() * 2),
        "o_proj": (lambda layer: F.linear(attn_out, w["o"][layer]), o_fused, w["o"][0].numel() * 2),
        "norm + gate_up + SiLU gate": (gate_up_torch, gate_up_fused, w["gate_up"][0].numel() * 2),
        "down_proj": (lambda layer: F.linear(act, w["down"][layer]), down_fused, w["down"][0].numel() * 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--block-n", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--block-k", type=int, nargs="+", default=[0], help="K span of a weight tile (0: the kernel's default)")
    parser.add_argument("--early-launch", type=int, nargs="+", default=[1], choices=[0, 1],
                        help="1 (the kernels' default): a kernel lets the next one launch as it starts; 0: once its weight is read")
    args = parser.parse_args()
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    shapes = {
        "qkv": ((HEADS + 2 * KV_HEADS) * DIM, HIDDEN), "qkv_bias": ((HEADS + 2 * KV_HEADS) * DIM,),
        "o": (HIDDEN, HEADS * DIM), "gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER),
    }
    # one weight per layer, as a decode step reads them: a weight read again would come from L2
    weights = {name: [torch.randn(shape, device=dev, dtype=dt) * 0.02 for _ in range(CALLS)] for name, shape in shapes.items()}
    k_cache, v_cache = torch.zeros(2, 4096, KV_HEADS, DIM, device=dev, dtype=dt)
    pdl = launch.launch_options(torch.device(dev))
    print(f"device: {torch.cuda.get_device_name()}; microseconds per call (weight GB/s), {CALLS} calls per graph, each on its own weights; "
          f"programmatic dependent launch {pdl}")
    tiles = [dict(block_n=b, num_warps=nw, early_launch=bool(e), **({"block_k": k} if k else {}))
             for nw in args.warps for b in args.block_n for k in args.block_k for e in args.early_launch]
    names = [f"tile {t['block_n']}, {t['num_warps']} warps" + (f", k {t['block_k']}" if "block_k" in t else "") + (", early" if t["early_launch"] else ", late")
             for t in tiles]
    print("| projection | rows | torch ops | fused (defaults) | " + " | ".join(names) + " |")
    print("| --- " * (4 + len(tiles)) + "|")
    for rows in args.rows:
        for name, (ref, fused, nbytes) in cases(rows, weights, k_cache, v_cache).items():
            cells = []
            for fn in [ref, fused] + [(lambda layer, t=t, fused=fused: fused(layer, t)) for t in tiles]:
                try:
                    us = graph_us(fn)
                    cells.append(f"{us:.1f} ({nbytes / us / 1e3:.0f})")
                except Exception as exc:  # a tile that does not compile for this shape
                    cells.append(f"failed: {type(exc).__name__}")
            print(f"| {name} | {rows} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
