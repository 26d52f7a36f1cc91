"""The fused MoE kernels (``omni_core.models.kernels.fused_moe``) alone on one GPU at Qwen3-Omni's
thinker sizes (hidden 2048, 128 experts top-8 of width 768, bf16) or its talker's (``--talker``:
hidden 1024, 128 experts top-6 of width 384): microseconds a layer and the bandwidth they reach
reading the experts the tokens are routed to, for several tile settings, with torch's per-expert
loop (the CPU path run on the GPU) for reference at small batches. Each setting is timed replayed
in a CUDA graph, as the engine's decode steps run it: timed eagerly, the grouped path's many small
launches made it look several times slower than in a step, and a threshold chosen that way made
the served model slower (docs/experiments/2026-12-06-qwen3-omni-serve-e2e.md).

    python benchmarks/fused_moe_gpu.py --tokens 1 8 64 512 4096
    python benchmarks/fused_moe_gpu.py --talker --tokens 1 8 16 32 64
"""

from __future__ import annotations

import argparse
import json

import torch
from omni_core.models.kernels import fused_moe
from omni_core.models.moe import SparseMoeBlock

VARIANTS = {
    "default": {},
    "gemv n8": dict(gemv_gate_up_n=8, gemv_down_n=8),
    "gemv n8 k512": dict(gemv_gate_up_n=8, gemv_down_n=8, gemv_k=512),
    "gemv k512": dict(gemv_k=512),
    "gemv warps4": dict(gemv_warps=4),
    "gemv warps16": dict(gemv_warps=16),
    "grouped n128": dict(grouped_n=128),
    "grouped k128": dict(grouped_k=128),
    "grouped m32/128": dict(grouped_m_small=32, grouped_m=128),
    "grouped warps8": dict(grouped_warps=8),
    "gemv to 256 pairs": dict(gemv_max_pairs=256),
    "gemv to 512 pairs": dict(gemv_max_pairs=512),
    "gemv to 512 pairs n8": dict(gemv_max_pairs=512, gemv_gate_up_n=8, gemv_down_n=8),
}


def graphed(fn):
    """``fn`` captured in a CUDA graph (after warm-up runs on a side stream): its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def timed(fn, iters: int = 20) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1e3


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 512, 4096])
    parser.add_argument("--talker", action="store_true", help="the talker's sizes")
    args = parser.parse_args()
    torch.manual_seed(0)
    hidden, experts, top_k, inter = (1024, 128, 6, 384) if args.talker else (2048, 128, 8, 768)
    with torch.device("cuda"):
        block = SparseMoeBlock(hidden, experts, top_k, inter, norm_topk_prob=True).to(torch.bfloat16)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.02)
    ex = block.experts
    expert_bytes = 3 * hidden * inter * 2
    for tokens in args.tokens:
        x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
        ids, weights = fused_moe.route(x, block.gate.weight, top_k, True)
        touched = int(torch.unique(ids).numel())
        row = {"tokens": tokens, "experts_read": touched, "route_us": timed(lambda x=x: fused_moe.route(x, block.gate.weight, top_k, True))}
        for name, tiles in VARIANTS.items():
            us = timed(graphed(lambda tiles=tiles, x=x, ids=ids, weights=weights: fused_moe.experts_forward(x, ex.gate_up_proj, ex.down_proj, ids, weights, tiles)))
            row[name] = {"us": round(us, 1), "GB/s": round(touched * expert_bytes / us / 1e3)}
        if tokens <= 64:
            row["torch loop us"] = round(timed(lambda x=x, ids=ids, weights=weights: ex(x, ids.long(), weights.to(x.dtype)), iters=5), 1)
        ref = ex(x, ids.long(), weights.to(x.dtype))
        got = fused_moe.experts_forward(x, ex.gate_up_proj, ex.down_proj, ids, weights)
        row["max_abs_err_vs_torch"] = float((got.float() - ref.float()).abs().max())
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
