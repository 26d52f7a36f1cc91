"""Throughput of the AR engine vs transformers' generate on CPU, side by side in one run.

A small random Qwen2 (same weights in both). For each concurrency N, N requests with prompt
lengths drawn uniformly from [16, 512] and output lengths from [16, 256] (fixed seed) are
submitted together. Our engine runs them with continuous batching (each stops at its own
length); transformers runs one left-padded batch with max_new_tokens = the longest output
(useful tokens only are counted for both). The two alternate ``--repeats`` times and the median
of each is reported, so load changes on a shared machine hit both alike. Our prefix cache is
cleared before each run, so a repeat recomputes its prompts as the first run did. Prints a
markdown table of output tokens/s and ratios: of wall time, and of the process's CPU seconds
(which time spent waiting for a core on a busy machine does not inflate).

``--profile N`` instead runs our engine once at concurrency N under cProfile and prints where
the time goes, by part of a step (model matmuls, attention, other model ops, batch preparation,
sampling, scheduling). ``--attention`` times ``SdpaBackend``'s decode paths alone (per sequence,
grouped by context length, one padded batch, and the host C kernel where it is built and there
are at most two threads) on a paged cache of the model's shape: one decode step (plan + all
layers) for N sequences with contexts drawn from [16, 768]. ``OMNI_NATIVE=0`` in the
environment runs our engine without the host kernel (its CPU decode then takes the grouped path).
``--steps N`` times only our engine at concurrency N: seconds in prefill and in decode steps,
median of ``--repeats`` runs (what alternating two checkouts of the code compares best).
``--mlp-rows A B ...`` times only the prefill of the prompts of the last ``--concurrency`` value
(each request ``max_tokens=1``) with the CPU MLP's row chunk (``layers.CPU_MLP_ROWS``) set to each
value in turn (0: whole steps), 5 alternations, and counts each run's minor page faults.
``engine_cpu_bound.py`` counts the work each side does on this workload and what ratio its
matmuls alone allow.

    python benchmarks/engine_cpu.py [--concurrency 1 8 32] [--threads 1] [--repeats 3] [--profile 32] [--steps 32] [--attention]
    python benchmarks/engine_cpu.py --threads 1 --concurrency 32 --mlp-rows 0 512 256 1024
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import statistics
import tempfile
import time

import torch
import transformers
from omni_core.scheduler import AREngine, SamplingParams


def make_checkpoint(path: str, args) -> transformers.PreTrainedModel:
    config = transformers.Qwen2Config(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 4, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, max_position_embeddings=1024, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).eval()
    model.save_pretrained(path)
    return model


def workload(n: int, seed: int, vocab: int):
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(16, 512))] for _ in range(n)]
    outputs = [rng.randint(16, 256) for _ in range(n)]
    return prompts, outputs


def run_ours(engine: AREngine, prompts, outputs) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process)"""
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in outputs]
    engine.reset_prefix_cache()  # every run computes its prompts
    start, cpu = time.perf_counter(), time.process_time()
    outs = engine.generate(prompts, params)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert [len(o.token_ids) for o in outs] == outputs
    return elapsed, cpu


@torch.inference_mode()
def run_transformers(model, prompts, outputs) -> tuple[float, float]:
    longest = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding, as batched generation needs
        ids[i, longest - len(p) :] = torch.tensor(p)
        mask[i, longest - len(p) :] = 1
    start, cpu = time.perf_counter(), time.process_time()
    model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(outputs), min_new_tokens=max(outputs), do_sample=False, pad_token_id=0)
    return time.perf_counter() - start, time.process_time() - cpu


# (part of a step, substrings of profiled function names), first match wins
PARTS = [
    # oneDNN's packed matmul (MLP gate/up, logits head), the host linear kernel (q/k/v, o_proj, down_proj)
    ("model matmuls (linear, logits)", ("_nn.linear", "_linear_pointwise", "native/linear.py")),
    ("attention", ("attention.py", "grouped_decode.py", "paged_backend.py", "native/paged_", "scaled_dot_product", "index_select", "index_copy")),
    ("other model ops (norms, rotary, activation, embedding)", ("omni_core/models/", "torch/nn/", "rms_norm", "silu", "embedding", "method 'chunk'", "built-in method torch.cat")),
    ("batch preparation (model_runner)", ("model_runner.py",)),
    ("sampling", ("sampler.py", "argmax")),
    ("scheduling, blocks, outputs", ("ar_scheduler.py", "block_manager.py", "sequence.py", "engine.py")),
]


def profile(engine: AREngine, n: int, vocab: int, seed: int) -> None:
    prompts, outputs = workload(n, seed + n, vocab)
    profiler = cProfile.Profile()
    profiler.enable()
    elapsed, _ = run_ours(engine, prompts, outputs)
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    totals = dict.fromkeys([name for name, _ in PARTS] + ["other (torch tensor ops, Python)"], 0.0)
    for (path, line, func), (_, _, tottime, _, _) in stats.items():
        where = f"{path}:{line}({func})"
        part = next((name for name, keys in PARTS if any(k in where for k in keys)), "other (torch tensor ops, Python)")
        totals[part] += tottime
    steps = stats.get(next(k for k in stats if k[0].endswith("engine.py") and k[2] == "step"))[1]
    whole = sum(totals.values())
    print(f"concurrency {n}: {sum(outputs)} tokens in {steps} steps, {elapsed:.2f} s under cProfile ({sum(outputs) / elapsed:.0f} tok/s)")
    print("| part of a step | ms per step | share |")
    print("| --- | --- | --- |")
    for name, t in totals.items():
        print(f"| {name} | {t / steps * 1e3:.2f} | {t / whole:.0%} |")


def time_steps(engine: AREngine, n: int, args) -> None:
    """Our engine alone: prefill and decode seconds of each run at concurrency n, and their medians."""
    prompts, outputs = workload(n, args.seed + n, args.vocab)
    runner, run = engine.runner, engine.runner.run
    spent = {True: 0.0, False: 0.0}

    def timed(seqs, is_prefill):
        start = time.perf_counter()
        try:
            return run(seqs, is_prefill)
        finally:
            spent[is_prefill] += time.perf_counter() - start

    runner.run = timed
    runs = []
    for _ in range(args.repeats):
        spent[True] = spent[False] = 0.0
        wall, _ = run_ours(engine, prompts, outputs)
        runs.append((wall, spent[True], spent[False]))
        print(f"concurrency {n}: {wall:.3f} s, prefill steps {spent[True]:.3f} s, decode steps {spent[False]:.3f} s", flush=True)
    wall, prefill, decode = (statistics.median(r[i] for r in runs) for i in range(3))
    print(f"median of {len(runs)}: {wall:.3f} s, prefill steps {prefill:.3f} s, decode steps {decode:.3f} s")


def time_prefill_by_mlp_rows(engine: AREngine, n: int, chunks: list[int], args, rounds: int = 5) -> None:
    """Seconds and minor page faults of prefilling n prompts, per CPU MLP row chunk, alternating."""
    import resource

    from omni_core.models import layers

    prompts, _ = workload(n, args.seed + n, args.vocab)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    seconds = {c: [] for c in chunks}
    faults = {c: [] for c in chunks}
    default = layers.CPU_MLP_ROWS
    try:
        for _ in range(rounds):
            for c in chunks:
                layers.CPU_MLP_ROWS = c or 1 << 62
                engine.reset_prefix_cache()
                before, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
                engine.generate(prompts, params)
                seconds[c].append(time.perf_counter() - start)
                faults[c].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    finally:
        layers.CPU_MLP_ROWS = default
    print(f"prefill of {n} prompts ({sum(map(len, prompts))} tokens), median of {rounds} alternating runs:")
    print("| MLP row chunk | seconds | minor page faults |")
    print("| --- | --- | --- |")
    for c in chunks:
        print(f"| {c or 'whole steps'} | {statistics.median(seconds[c]):.3f} | {int(statistics.median(faults[c]))} |")


def scattered_paged_cache(lens: list[int], kv_heads: int, head_dim: int, block_size: int, seed: int):
    """(block tables, k_cache, v_cache) of random K/V, each sequence's blocks placed at random."""
    widths = [-(-c // block_size) for c in lens]
    ids = torch.randperm(sum(widths), generator=torch.Generator().manual_seed(seed)).tolist()
    tables, at = [], 0
    for w in widths:
        tables.append(ids[at : at + w] + [0] * (max(widths) - w))
        at += w
    k_cache = torch.randn(sum(widths) * block_size, kv_heads, head_dim)
    return torch.tensor(tables), k_cache, torch.randn_like(k_cache)


@torch.inference_mode()
def time_decode_attention(args, sizes, block_size: int = 16, trials: int = 50) -> None:
    from omni_core.models import SdpaBackend
    from omni_core.models.attention import AttentionMetadata
    from omni_core.models.native import paged_decode

    head_dim = args.hidden // args.heads
    paths = {"per sequence": SdpaBackend(per_sequence=True), "grouped": SdpaBackend(native=False), "padded batch": SdpaBackend(per_sequence=False)}
    if paged_decode.preferred():
        paths["host kernel"] = SdpaBackend()
    print(f"decode attention alone, {args.layers} layers, best of {trials} (ms per step)")
    print("| sequences | " + " | ".join(paths) + " |")
    print("| --- |" + " --- |" * len(paths))
    for n in sizes:
        rng = random.Random(n)
        lens = [rng.randint(16, 768) for _ in range(n)]
        tables_t, k_cache, v_cache = scattered_paged_cache(lens, args.kv_heads, head_dim, block_size, seed=n)
        ctx = torch.tensor(lens)
        slots = tables_t[torch.arange(n), (ctx - 1) // block_size] * block_size + (ctx - 1) % block_size
        q, k, v = torch.randn(n, args.heads, head_dim), torch.randn(n, args.kv_heads, head_dim), torch.randn(n, args.kv_heads, head_dim)
        best = {}
        for _ in range(trials):
            for name, backend in paths.items():
                start = time.perf_counter()
                meta = AttentionMetadata(slots, tables_t, ctx, torch.ones_like(ctx), 1, block_size)
                meta.host_query_lens, meta.host_context_lens = [1] * n, lens
                backend.prepare(meta)
                for _ in range(args.layers):
                    backend.forward(q, k, v, k_cache, v_cache, meta, head_dim**-0.5)
                best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)
        print(f"| {n} | " + " | ".join(f"{best[name] * 1e3:.2f}" for name in paths) + " |", flush=True)


def add_workload_arguments(parser: argparse.ArgumentParser, threads: int) -> None:
    """The model and workload options this benchmark shares with engine_cpu_bound.py."""
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--threads", type=int, default=threads)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_arguments(parser, torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", type=int, metavar="N", help="profile our engine at concurrency N instead")
    parser.add_argument("--steps", type=int, metavar="N", help="time only our engine's prefill and decode steps at concurrency N")
    parser.add_argument("--attention", action="store_true", help="time the decode attention paths alone instead")
    parser.add_argument("--mlp-rows", type=int, nargs="+", metavar="ROWS", help="time prefill per CPU MLP row chunk instead (0: whole steps)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.attention:
        time_decode_attention(args, args.concurrency)
        return
    print(f"model: Qwen2 hidden {args.hidden}, {args.layers} layers, {args.heads}/{args.kv_heads} heads, vocab {args.vocab}, float32; torch threads {args.threads}")
    with tempfile.TemporaryDirectory() as tmp:
        hf = make_checkpoint(tmp, args)
        engine = AREngine.from_pretrained(tmp, max_num_seqs=64, max_num_batched_tokens=4096, kv_cache_bytes=1 << 30)
        warm_prompts, warm_outputs = workload(2, 99, args.vocab)
        run_ours(engine, warm_prompts, [4, 4])
        if args.profile:
            profile(engine, args.profile, args.vocab, args.seed)
            return
        if args.steps:
            time_steps(engine, args.steps, args)
            return
        if args.mlp_rows:
            time_prefill_by_mlp_rows(engine, args.concurrency[-1], args.mlp_rows, args)
            return
        run_transformers(hf, warm_prompts, [4, 4])
        print("| concurrent requests | output tokens | ours tok/s | transformers tok/s | ratio | ratio of CPU seconds |")
        print("| --- | --- | --- | --- | --- | --- |")
        for n in args.concurrency:
            prompts, outputs = workload(n, args.seed + n, args.vocab)
            ours_runs, theirs_runs = [], []
            for _ in range(args.repeats):
                ours_runs.append(run_ours(engine, prompts, outputs))
                theirs_runs.append(run_transformers(hf, prompts, outputs))
            ours, theirs = statistics.median(r[0] for r in ours_runs), statistics.median(r[0] for r in theirs_runs)
            ours_cpu, theirs_cpu = statistics.median(r[1] for r in ours_runs), statistics.median(r[1] for r in theirs_runs)
            tokens = sum(outputs)
            print(f"| {n} | {tokens} | {tokens / ours:.1f} | {tokens / theirs:.1f} | {theirs / ours:.2f}x | {theirs_cpu / ours_cpu:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
