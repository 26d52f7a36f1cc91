"""How far ahead of transformers' ``generate`` our engine can get on ``engine_cpu.py``'s workload.

Counts the work each side does for the same N requests and times only its matrix products on
this CPU, with the shapes each side runs: transformers prefills every prompt left-padded to the
longest and decodes all N rows until the longest output; our engine prefills each prompt once,
in steps of at most ``--max-batched-tokens`` tokens, and decodes only the rows still running
(requests stop at their own lengths). The linear layers and the logits head are most of either
side's time, so the ratio of the two matmul-only times is about the most that faster attention
and less per-step overhead can bring. Same model shape and workload as ``engine_cpu.py``. Also
prints the matmul throughput at a few row counts (decode batches are small, prefill steps large).

    python benchmarks/engine_cpu_bound.py [--concurrency 1 8 32] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch
from engine_cpu import add_workload_arguments, workload


def linear_shapes(args) -> list[tuple[int, int]]:
    """(in, out) of one decoder layer's matmuls: fused q/k/v, o, fused gate/up, down."""
    head_dim = args.hidden // args.heads
    kv = args.kv_heads * head_dim
    return [(args.hidden, args.hidden + 2 * kv), (args.hidden, args.hidden), (args.hidden, 8 * args.hidden), (4 * args.hidden, args.hidden)]


class MatmulClock:
    """Seconds for ``rows`` rows through every layer's linears (and, for ``logit_rows`` of them,
    the tied logits head), best of a few runs, remembered per shape."""

    def __init__(self, args):
        self.args = args
        self.known: dict[tuple[int, int, int], float] = {}

    def time(self, rows: int, i: int, o: int) -> float:
        key = (rows, i, o)
        if key not in self.known:
            x, w = torch.randn(rows, i), torch.randn(o, i)
            best = float("inf")
            for _ in range(3 if rows * o > 1 << 22 else 10):
                start = time.perf_counter()
                torch.nn.functional.linear(x, w)
                best = min(best, time.perf_counter() - start)
            self.known[key] = best
        return self.known[key]

    def step(self, rows: int, logit_rows: int) -> float:
        layers = sum(self.time(rows, i, o) for i, o in linear_shapes(self.args)) * self.args.layers
        return layers + (self.time(logit_rows, self.args.hidden, self.args.vocab) if logit_rows else 0.0)


def macs_per_token(args) -> tuple[int, int]:
    """(multiply-adds per token in the decoder layers, in the logits head)"""
    return sum(i * o for i, o in linear_shapes(args)) * args.layers, args.hidden * args.vocab


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_arguments(parser, threads=1)
    parser.add_argument("--max-batched-tokens", type=int, default=4096, help="our engine's prefill step size (engine_cpu.py uses 4096)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = MatmulClock(args)
    layer_macs, head_macs = macs_per_token(args)
    print(f"linear layers: {layer_macs / 1e6:.2f}M multiply-adds per token, logits head {head_macs / 1e6:.2f}M; torch threads {args.threads}")
    print("| N | side | prompt tokens prefilled | rows decoded (row-steps) | linear GFLOP | matmul-only s | GFLOP/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for n in args.concurrency:
        prompts, outputs = workload(n, args.seed + n, args.vocab)
        lens = [len(p) for p in prompts]
        # the first output token of each request comes from its prefill, the rest from decode steps
        theirs_prefill = [n * max(lens)]
        theirs_decode = [n] * (max(outputs) - 1)
        total, ours_prefill = sum(lens), []
        while total > 0:
            ours_prefill.append(min(total, args.max_batched_tokens))
            total -= ours_prefill[-1]
        ours_decode = [sum(1 for m in outputs if m > step) for step in range(1, max(outputs))]
        times = {}
        for side, prefill, decode in (("transformers", theirs_prefill, theirs_decode), ("ours", ours_prefill, ours_decode)):
            tokens, rows = sum(prefill), sum(decode)
            flops = 2 * (tokens * layer_macs + n * head_macs + rows * (layer_macs + head_macs))
            # a prefill computes logits for one row per request (transformers: logits_to_keep=1)
            seconds = sum(clock.step(t, 0) for t in prefill) + clock.time(n, args.hidden, args.vocab) + sum(clock.step(r, r) for r in decode)
            times[side] = seconds
            print(f"| {n} | {side} | {tokens} | {rows} | {flops / 1e9:.1f} | {seconds:.2f} | {flops / seconds / 1e9:.0f} |", flush=True)
        print(f"| {n} | bound: transformers / ours matmul time | | | | **{times['transformers'] / times['ours']:.2f}x** | |", flush=True)
    shapes = linear_shapes(args) + [(args.hidden, args.vocab)]
    print("\nmatmul throughput by rows (GFLOP/s; columns: in x out, the last is the logits head)")
    print("| rows | " + " | ".join(f"{i} x {o}" for i, o in shapes) + " |")
    print("| --- |" + " --- |" * len(shapes))
    for rows in (1, 8, 20, 32, 512, 4096):
        print(f"| {rows} | " + " | ".join(f"{2 * rows * i * o / clock.time(rows, i, o) / 1e9:.0f}" for i, o in shapes) + " |", flush=True)


if __name__ == "__main__":
    main()
