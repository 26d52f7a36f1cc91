"""The host C kernels (``omni_core/models/native``) against the torch calls they replace, on the
shapes of ``engine_cpu.py``'s model, and in the engine with one kernel switched off.

``--linear``: each projection of the model (q/k/v, o_proj, gate/up, down_proj, logits head) at
1-512 rows: the linear kernel on its packed weight, oneDNN's matmul on its packed weight, and
``F.linear`` (microseconds a call and GFLOP/s, best of 100 after warm-up).
``--prefill-attention N``: causal attention of one layer over N prompts of 16-512 tokens (the
workload's lengths) from a scattered paged cache: the prefill kernel against per-sequence SDPA
(ms a layer, best of 5).
``--engine-ab NAME``: one engine with kernel NAME and one without (``paged_decode`` or
``paged_prefill``: what ``native.preferred`` says; ``linear``: forced on and off with
``OMNI_HOST_LINEAR``, whatever the engine's own measurement would choose), built in one process
from the same checkpoint; the benchmark's workload at the last ``--concurrency`` value,
alternating ``--repeats`` times; medians of wall and CPU seconds, and whether both gave the same
tokens. ``--any-threads`` lets the kernels run at any intra-op thread count
(``native.MAX_INTRA_OP_THREADS`` raised), to measure where that limit belongs.

    python benchmarks/cpu_kernels.py --threads 1 --linear --prefill-attention 32
    python benchmarks/cpu_kernels.py --threads 1 --concurrency 32 --engine-ab linear --repeats 7
    python benchmarks/cpu_kernels.py --threads 4 --concurrency 32 --engine-ab paged_prefill --any-threads
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F
from engine_cpu import add_workload_arguments, make_checkpoint, run_ours, scattered_paged_cache, workload
from omni_core.models import native
from omni_core.models.cpu_linear import HOST_LINEAR_ENV, _packed_matmul, _reorder
from omni_core.models.native import linear as host_linear
from omni_core.models.native import paged_prefill
from omni_core.scheduler import AREngine, SamplingParams


def best_seconds(fn, *args, trials: int = 100) -> float:
    for _ in range(5):
        fn(*args)
    best = float("inf")
    for _ in range(trials):
        start = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - start)
    return best


@torch.inference_mode()
def time_linear(args) -> None:
    head_dim = args.hidden // args.heads
    shapes = {
        "q/k/v": (args.hidden, (args.heads + 2 * args.kv_heads) * head_dim),
        "o_proj": (args.heads * head_dim, args.hidden),
        "gate/up": (args.hidden, 8 * args.hidden),
        "down_proj": (4 * args.hidden, args.hidden),
        "logits head": (args.hidden, args.vocab),
    }
    print("| projection | rows | linear kernel us (GFLOP/s) | oneDNN packed us | F.linear us | best torch / kernel |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, (k, n) in shapes.items():
        weight = torch.randn(n, k)
        ours, onednn = host_linear.pack(weight), _reorder(weight)
        for rows in (1, 8, 32, 64, 512):
            x = torch.randn(rows, k)
            t_ours = best_seconds(host_linear.linear, x, ours, None, n)
            t_onednn = best_seconds(_packed_matmul, x, onednn, None)
            t_torch = best_seconds(F.linear, x, weight)
            flops = 2 * rows * k * n
            print(f"| {name} | {rows} | {t_ours * 1e6:.1f} ({flops / t_ours / 1e9:.0f}) | {t_onednn * 1e6:.1f} | {t_torch * 1e6:.1f} | {min(t_onednn, t_torch) / t_ours:.2f}x |", flush=True)


@torch.inference_mode()
def time_prefill_attention(args, n: int, block_size: int = 16) -> None:
    head_dim = args.hidden // args.heads
    rng = random.Random(n)
    lens = [rng.randint(16, 512) for _ in range(n)]
    tables_t, k_cache, v_cache = scattered_paged_cache(lens, args.kv_heads, head_dim, block_size, seed=n)
    q = torch.randn(sum(lens), args.heads, head_dim)
    ctx = torch.tensor(lens)
    pos = [torch.arange(c) for c in lens]
    slots = [tables_t[b, p // block_size] * block_size + p % block_size for b, p in enumerate(pos)]
    starts = [sum(lens[:b]) for b in range(n)]
    scale = head_dim**-0.5

    def per_sequence_sdpa():  # the backend's path without the kernel, for prompts without history
        for b, c in enumerate(lens):
            qb = q[starts[b] : starts[b] + c].transpose(0, 1)[None]
            kb, vb = k_cache[slots[b]].transpose(0, 1)[None], v_cache[slots[b]].transpose(0, 1)[None]
            F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale, enable_gqa=True)

    def kernel():
        paged_prefill.paged_prefill_attention(q, k_cache, v_cache, tables_t, ctx, ctx, max(lens), block_size, scale)

    t_kernel, t_sdpa = best_seconds(kernel, trials=5), best_seconds(per_sequence_sdpa, trials=5)
    print(f"\nprefill attention, one layer, {n} prompts ({sum(lens)} tokens): kernel {t_kernel * 1e3:.1f} ms, per-sequence SDPA {t_sdpa * 1e3:.1f} ms ({t_sdpa / t_kernel:.2f}x)")


@contextlib.contextmanager
def without_kernel(name: str):
    """``native.preferred`` says no for kernel ``name`` inside the block."""
    preferred = native.preferred
    native.preferred = lambda kernel: kernel != name and preferred(kernel)
    try:
        yield
    finally:
        native.preferred = preferred


@contextlib.contextmanager
def environment(var: str, value: str):
    before = os.environ.get(var)
    os.environ[var] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[var]
        else:
            os.environ[var] = before


def engine_ab(args, name: str) -> None:
    n = args.concurrency[-1]
    prompts, outputs = workload(n, args.seed + n, args.vocab)
    if name == "linear":
        sides = {"with linear": lambda: environment(HOST_LINEAR_ENV, "1"), "without linear": lambda: environment(HOST_LINEAR_ENV, "0")}
    else:
        sides = {f"with {name}": contextlib.nullcontext, f"without {name}": lambda: without_kernel(name)}
    with tempfile.TemporaryDirectory() as tmp:
        make_checkpoint(tmp, args)
        engines = {}
        for side, switch in sides.items():
            with switch():  # the linear kernel is chosen when the engine packs its weights
                engines[side] = AREngine.from_pretrained(tmp, max_num_seqs=64, max_num_batched_tokens=4096, kv_cache_bytes=1 << 29)
        runs = {side: [] for side in sides}
        tokens = {}
        for _ in range(args.repeats + 1):  # the first round warms both up
            for side, switch in sides.items():
                with switch():  # attention kernels are chosen at every step
                    runs[side].append(run_ours(engines[side], prompts, outputs))
                    engines[side].reset_prefix_cache()
                    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in outputs]
                    tokens[side] = [o.token_ids for o in engines[side].generate(prompts, params)]
    print(f"{n} requests, {sum(outputs)} output tokens, {args.repeats} alternations (medians):")
    print("| engine | wall s | CPU s | runs (wall s) |")
    print("| --- | --- | --- | --- |")
    for side, rows in runs.items():
        rows = rows[1:]
        print(f"| {side} | {statistics.median(r[0] for r in rows):.3f} | {statistics.median(r[1] for r in rows):.3f} | {', '.join(f'{r[0]:.3f}' for r in rows)} |")
    same = sum(a == b for a, b in zip(*tokens.values(), strict=True))
    print(f"the same tokens for {same} of {n} requests")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_arguments(parser, torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--linear", action="store_true", help="time each projection on the linear kernel, oneDNN and F.linear")
    parser.add_argument("--prefill-attention", type=int, metavar="N", help="time one layer's prefill attention over N prompts")
    parser.add_argument("--engine-ab", metavar="KERNEL", choices=["paged_decode", "paged_prefill", "linear"], help="the engine with and without KERNEL, alternating")
    parser.add_argument("--any-threads", action="store_true", help="let the kernels run at any intra-op thread count")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.any_threads:
        native.MAX_INTRA_OP_THREADS = 1 << 10
    print(f"model: Qwen2 hidden {args.hidden}, {args.heads}/{args.kv_heads} heads, vocab {args.vocab}, float32; torch threads {args.threads}")
    if args.linear:
        time_linear(args)
    if args.prefill_attention:
        time_prefill_attention(args, args.prefill_attention)
    if args.engine_ab:
        engine_ab(args, args.engine_ab)


if __name__ == "__main__":
    main()
