"""The code predictor at real sizes (random bf16 weights): the residual codes of one frame for a
batch (15 codebooks, 5 layers each), sampled and greedy, launched kernel by kernel and replayed as
one CUDA graph; each on torch ops or the core's fused kernels (``fused``), and drawing its codes
among the top-k candidates or over the whole codebook (``candidates``).

    python benchmarks/qwen3_omni_speech_profile.py
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from omni_core.scheduler import sampler
from omni_qwen3_omni.predictor_graphs import PredictorGraphs
from qwen3_omni_speech_gpu import build, sync


def timed(fn, device: str, repeat: int = 10) -> float:
    fn()
    sync(device)
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    sync(device)
    return (time.perf_counter() - t) / repeat * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true")
    args = parser.parse_args()
    args.kv_gib, args.eager, args.frames = 2.0, False, 8
    dtype = torch.bfloat16 if torch.device(args.device).type == "cuda" else torch.float32
    worker, engine, _, _ = build(args, args.device, dtype)
    hidden = worker.model.hidden_size
    cuda = torch.device(args.device).type == "cuda"
    variants = [(fused, candidates) for fused in ((False, True) if worker.fused_predictor else (False,)) for candidates in (False, True)]
    whole_vocabulary, candidates_fraction = 1 << 40, sampler.TOP_K_FRACTION
    for batch in args.batches:
        h = torch.randn(batch, hidden, device=args.device, dtype=dtype)
        code0 = torch.randint(0, 2048, (batch,), device=args.device)
        seeds, frames = torch.arange(batch, device=args.device), torch.ones(batch, dtype=torch.int64, device=args.device)
        for fused, candidates in variants:
            worker.fused_predictor = fused
            sampler.TOP_K_FRACTION = candidates_fraction if candidates else whole_vocabulary
            row = {"batch": batch, "fused": fused, "candidates": candidates}
            graphs = PredictorGraphs(worker._predict_rows) if cuda else None  # captured with this variant's code
            for mode, run in (("eager", worker._predict_rows), ("graph", graphs)):
                if run is None:
                    continue
                for greedy in (False, True):
                    if greedy and candidates:
                        continue  # greedy draws nothing
                    name = f"{mode}_{'greedy' if greedy else 'sampled'}_ms"
                    row[name] = round(timed(lambda run=run, greedy=greedy, inputs=(h, code0, seeds, frames): run(*inputs, greedy), args.device), 2)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
