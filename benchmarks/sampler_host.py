"""Time of a step's sampling: building its tensors with a repetition penalty, and the sampler.

N sequences of a prompt plus some outputs (random ids, vocab V) all sample with a repetition
penalty. Times ``build_sampling_tensors`` for the same batch step after step (one new token per
sequence each step, the previous step's tensors reused, as the engine does) and for a batch seen
for the first time; then ``Sampler`` on [N, V] random logits (scaled by ``--logit-scale``: larger
is more peaked), greedy, and for temperature alone and with top-k, top-p and min-p. Milliseconds
per step.

    python benchmarks/sampler_host.py [--sequences 32] [--tokens 600] [--vocab 151936] [--device cpu]
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from omni_core.scheduler import SamplingParams
from omni_core.scheduler.sampler import Sampler, build_sampling_tensors
from omni_core.scheduler.sequence import Sequence


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=600, help="tokens per sequence (prompt 5/6, output 1/6)")
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--logit-scale", type=float, default=4.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(0)
    prompt = args.tokens * 5 // 6
    seqs = []
    for i in range(args.sequences):
        seq = Sequence(f"s{i}", [rng.randrange(args.vocab) for _ in range(prompt)], SamplingParams(temperature=0.8, repetition_penalty=1.05, seed=i))
        for _ in range(args.tokens - prompt):
            seq.append_token(rng.randrange(args.vocab))
        seqs.append(seq)

    def sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    previous = build_sampling_tensors(seqs, args.vocab, args.device)
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        for seq in seqs:
            seq.append_token(rng.randrange(args.vocab))
        previous = build_sampling_tensors(seqs, args.vocab, args.device, reuse=previous)
    sync()
    same = (time.perf_counter() - start) / args.steps * 1e3
    start = time.perf_counter()
    for _ in range(args.steps):
        build_sampling_tensors(seqs, args.vocab, args.device)
    sync()
    fresh = (time.perf_counter() - start) / args.steps * 1e3
    print(f"{args.sequences} sequences of ~{args.tokens} tokens, vocab {args.vocab}, {args.device}: "
          f"same batch {same:.2f} ms a step, new batch {fresh:.2f} ms a step")

    logits = torch.randn(args.sequences, args.vocab, generator=torch.Generator().manual_seed(0)).to(args.device) * args.logit_scale
    sampler = Sampler()
    print("| sampling | ms a step |")
    print("| --- | --- |")
    settings = {"greedy": dict(temperature=0), "temperature 0.8": {}, "top_k 50": dict(top_k=50), "top_p 0.9": dict(top_p=0.9),
                "top_k 20, top_p 0.8": dict(top_k=20, top_p=0.8), "min_p 0.05": dict(min_p=0.05)}
    for name, params in settings.items():
        batch = [Sequence(f"t{i}", [1], SamplingParams(**{"temperature": 0.8, "seed": i, **params})) for i in range(args.sequences)]
        tensors = build_sampling_tensors(batch, args.vocab, args.device)
        sampler(logits, tensors)
        sync()
        start = time.perf_counter()
        for _ in range(5):
            sampler(logits, tensors)
        sync()
        print(f"| {name} | {(time.perf_counter() - start) / 5 * 1e3:.1f} |", flush=True)


if __name__ == "__main__":
    main()
