"""Decode step time of the AR engine on one GPU against the memory-bandwidth roofline, eager and
with CUDA graphs (step by step, and overlapped: each step launched before the previous one's
tokens are read), for each attention backend side by side (``sdpa``: torch ops, ``triton``: the
fused kernels), kernels launched per decode step, the decode-attention kernel alone, and tokens/s
against transformers' generate on the same GPU.

Model: Qwen2-0.5B-shaped (24 layers, hidden 896, 14/2 heads of 64, FFN 4864) with CosyVoice3's
speech head size (vocab 6761, tied), random bf16 weights, made by transformers and loaded
through our checkpoint loader. Roofline of one decode step = (weight bytes + KV bytes of the
batch's context) / measured device-to-device copy bandwidth (bytes read + written per second).

    python benchmarks/engine_gpu.py [--batches 1 8 32 64] [--context 512] [--attention sdpa triton]

``--ab 'VAR=A|B'`` instead times, side by side in one process, overlapped graph steps of engines
built with the environment variable VAR set to each value (e.g. ``'OMNI_PDL=0|1'``; the
kernels' launch settings are re-read for each engine), alternating between them.
``--decode-step-phases N`` prints where the one-kernel batch-1 decode (``kernels.decode_step``)
spends a step: the mean time of each phase of a layer over N eager steps, of points inside phases
and of block 0's arrival at each barrier, read off the GPU timer.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import transformers
from omni_core.models.attention import AttentionMetadata, SdpaBackend
from omni_core.models.kernels import fused_linear, launch
from omni_core.models.kernels.decode_step import (
    DECODE_STEP_ENV,
    MARKS_PER_LAYER,
    PHASES_PER_LAYER,
    DecodeStepKernel,
)
from omni_core.models.kernels.paged_attention import paged_decode_attention
from omni_core.scheduler import AREngine, EngineRequest, SamplingParams


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    return 2 * nbytes * 20 / (start.elapsed_time(end) / 1e3)


def make_checkpoint(path: str, vocab: int) -> transformers.PreTrainedModel:
    config = transformers.Qwen2Config(
        vocab_size=vocab, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=True, rope_theta=1e6, dtype="bfloat16",
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(path)
    return model


def start_decoding(engine: AREngine, prompts: dict[str, list[int]], steps: int) -> None:
    """Adds greedy requests of ``steps`` + 20 tokens, runs their prefill and 5 warm-up decode steps."""
    for rid, prompt in prompts.items():
        engine.add_request(EngineRequest(rid, prompt_token_ids=prompt, params=SamplingParams(temperature=0, max_tokens=steps + 20, ignore_eos=True)))
    while engine.scheduler.waiting or engine.scheduler.prefilling:
        engine.step()
    for _ in range(5):
        engine.step()
    torch.cuda.synchronize()


def decode_step_ms(engine: AREngine, batch: int, context: int, steps: int, vocab: int) -> tuple[float, float | None]:
    """(engine.step() ms, model-only graph replay ms or None) at ``batch`` running sequences."""
    gen = torch.Generator().manual_seed(batch)
    start_decoding(engine, {f"b{batch}-{i}": torch.randint(0, vocab, (context,), generator=gen).tolist() for i in range(batch)}, steps)
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - start) / steps * 1e3
    replay_ms = None
    width = max(len(s.block_table) for s in engine.scheduler.running)
    key = engine.runner._graph_key(batch, width)
    if key is not None:
        replay_ms = time_cuda_ms(engine.runner.graphs[key][0].replay, iters=50)
    for rid in list(engine.requests):
        engine.abort(rid)
    return step_ms, replay_ms


PHASES = ("q/k/v + rotary + cache", "attention", "combine + o_proj", "norm + gate/up", "down_proj")


MARKS = (  # (phase, mark) points inside phases that decode_step.cu records with PROFILE
    (1, 0, "attention: q in shared memory"), (1, 1, "attention: K/V requested"), (1, 2, "attention: scores and softmax of the first span"),
    (1, 3, "attention: spans done"), (3, 4, "gate/up: norm done"), (3, 5, "gate/up: weight slice in shared memory"),
    (4, 6, "down_proj: activation requested"), (4, 7, "down_proj: weight slice in shared memory"),
)


def decode_step_phases(path: str, context: int, steps: int, vocab: int) -> None:
    """Mean us of each phase of a layer of the one-kernel batch-1 decode, of points inside phases
    and of the blocks' arrivals at the barrier that ends each phase, from the phase's start
    (layers 1 on: layer 0's first phase has no start mark), over ``steps`` eager engine steps."""
    os.environ[DECODE_STEP_ENV] = "1"
    engine = build_engine(path, (1,), "triton", cuda_graphs=False, kv_cache_bytes=2 << 30)
    gen = torch.Generator().manual_seed(0)
    start_decoding(engine, {"p": torch.randint(0, vocab, (context,), generator=gen).tolist()}, steps)
    model = engine.model
    step = model._decode_step[1]
    if step is None:
        print("the one-kernel decode does not apply here")
        return
    profiled = DecodeStepKernel(model, engine.runner.kv_caches, step.shape, step.kernel.device, step.blocks, profile=True)
    model._decode_step = (model._decode_step[0], profiled)
    layers, blocks = step.shape.layers, step.blocks
    n_ends, n_marks = layers * PHASES_PER_LAYER, layers * MARKS_PER_LAYER
    totals = torch.zeros(n_ends + n_marks + 2 * n_ends, dtype=torch.float64)
    for _ in range(steps):
        engine.step()
        torch.cuda.synchronize()
        record = profiled.phase_ends.cpu()
        record = record - record[0]  # ns since layer 0's first phase ended (exact in int64)
        arrivals = record[n_ends + n_marks :].view(n_ends, blocks)
        totals += torch.cat([record[: n_ends + n_marks], arrivals[:, 0], arrivals.max(1).values]).double()
    mean = totals / steps
    ends = mean[:n_ends].view(layers, PHASES_PER_LAYER)
    marks = mean[n_ends : n_ends + n_marks].view(layers, MARKS_PER_LAYER)
    first_in, last_in = mean[n_ends + n_marks :].view(2, layers, PHASES_PER_LAYER)
    starts = torch.cat([ends[:, 4:5].roll(1, 0), ends[:, :4]], dim=1)  # phase p of layer l starts when the one before ends
    phase_us = ((ends - starts)[1:] / 1e3).mean(0)
    print("| phase | mean us a layer | block 0 at its barrier | last block at the barrier |")
    print("| --- | --- | --- | --- |")
    for p, name in enumerate(PHASES):
        block0, last = (((t - starts)[1:, p] / 1e3).mean().item() for t in (first_in, last_in))
        print(f"| {name} | {phase_us[p].item():.2f} | {block0:.2f} | {last:.2f} |")
    print(f"| layer | {phase_us.sum().item():.2f} | | |")
    print("| point | us after its phase started |")
    print("| --- | --- |")
    for phase, mark, name in MARKS:
        print(f"| {name} | {((marks[1:, mark] - starts[1:, phase]) / 1e3).mean().item():.2f} |")
    for rid in list(engine.requests):
        engine.abort(rid)


def tokens_per_second(engine: AREngine, hf: transformers.PreTrainedModel | None, batch: int, context: int, new_tokens: int, vocab: int) -> tuple[float, float]:
    gen = torch.Generator().manual_seed(1000 + batch)
    prompts = [torch.randint(0, vocab, (context,), generator=gen).tolist() for _ in range(batch)]
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    torch.cuda.synchronize()
    t = time.perf_counter()
    outs = engine.generate(prompts, params)
    torch.cuda.synchronize()
    ours = batch * new_tokens / (time.perf_counter() - t)
    assert all(len(o.token_ids) == new_tokens for o in outs)
    if hf is None:
        return ours, float("nan")
    ids = torch.tensor(prompts, device="cuda")
    with torch.inference_mode():
        hf.generate(ids[:, :16], max_new_tokens=4, do_sample=False, pad_token_id=0)  # warm-up
        torch.cuda.synchronize()
        t = time.perf_counter()
        hf.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
    theirs = batch * new_tokens / (time.perf_counter() - t)
    return ours, theirs


def kernels_per_decode_step(engine: AREngine, context: int, vocab: int) -> int:
    """CUDA kernels one eager decode step launches at batch 1 (the same kernels a graph replays)."""
    engine.add_request(EngineRequest("count", prompt_token_ids=list(range(1, context + 1)), params=SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)))
    while engine.scheduler.waiting or engine.scheduler.prefilling:
        engine.step()
    engine.step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        engine.step()
        torch.cuda.synchronize()
    engine.abort("count")
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(1 for n in names if not n.startswith(("Memcpy", "Memset")))


def host_profile(engine: AREngine, context: int, steps: int, vocab: int, top: int = 25) -> None:
    """cProfile of ``steps`` decode steps of one sequence: the host's share of a step, by function."""
    import cProfile
    import pstats

    start_decoding(engine, {"profile": list(range(1, context + 1))}, steps)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        engine.step()
    profiler.disable()
    engine.abort("profile")
    print(f"\nhost profile of {steps} decode steps at batch 1 (tottime per step, top {top}):")
    stats = pstats.Stats(profiler)
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    for (path, line, func), (_, ncalls, tottime, cumtime, _) in rows:
        print(f"  {tottime / steps * 1e6:8.1f} us  {cumtime / steps * 1e6:8.1f} us cum  {ncalls / steps:5.1f}/step  {path.split('/')[-1]}:{line}({func})")


def replay_trace(engine: AREngine, context: int, replays: int, path: str, batch: int = 1) -> None:
    """Chrome trace of ``replays`` back-to-back replays of the decode graph of ``batch`` sequences,
    and a summary: each kernel's mean time, the replay's span and its idle share."""
    import json

    start_decoding(engine, {f"trace{i}": list(range(1 + i, context + 1 + i)) for i in range(batch)}, replays)
    key = engine.runner._graph_key(batch, len(engine.scheduler.running[0].block_table))
    graph = engine.runner.graphs[key][0]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    for i in range(batch):
        engine.abort(f"trace{i}")
    prof.export_chrome_trace(path)
    kernels = sorted((e for e in json.load(open(path))["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    per_replay = len(kernels) // replays
    if not per_replay:
        print(f"trace {path}: no kernels recorded")
        return
    spans = [kernels[i + per_replay - 1]["ts"] + kernels[i + per_replay - 1]["dur"] - kernels[i]["ts"] for i in range(0, per_replay * replays, per_replay)]
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e["name"][:60], []).append(e["dur"])
    print(f"\nbatch-{batch} graph replay trace ({path}): {per_replay} kernels, span {sum(spans) / len(spans):.1f} us per replay")
    print("| kernel | per replay | mean us | us per replay |")
    print("| --- | --- | --- | --- |")
    for name, durs in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
        print(f"| {name} | {len(durs) / replays:.0f} | {sum(durs) / len(durs):.2f} | {sum(durs) / replays:.1f} |")
    middle = kernels[per_replay * (replays // 2):per_replay * (replays // 2 + 1)]
    first = per_replay // 2 - per_replay // 2 % 6
    print("\nthe middle replay's kernels from the middle on (us from the replay's start; with programmatic dependent launch a kernel starts before the one before it ends):")
    print("| kernel | start | end | end - previous end |")
    print("| --- | --- | --- | --- |")
    t0 = middle[0]["ts"]
    for prev, e in zip(middle[first - 1:first + 12], middle[first:first + 13], strict=True):
        end = e["ts"] + e["dur"] - t0
        print(f"| {e['name'][:40]} | {e['ts'] - t0:.1f} | {end:.1f} | {end - (prev['ts'] + prev['dur'] - t0):.1f} |")


def step_gaps(engine: AREngine, context: int, steps: int, path: str) -> None:
    """Chrome trace of ``steps`` overlapped engine steps at batch 1 (CUDA activity only) and what the
    GPU runs between two graph replays: each copy or kernel outside the graph's run of kernels, its
    duration, and the idle gap before it (the profiler's launch overhead widens the gaps)."""
    import json

    start_decoding(engine, {"gaps": list(range(1, context + 1))}, steps)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    engine.abort("gaps")
    prof.export_chrome_trace(path)
    events = sorted((e for e in json.load(open(path))["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    print(f"\noverlapped steps at batch 1 ({path}): the GPU between replays (us; a replay's kernels left out)")
    print("| event | duration | gap before it |")
    print("| --- | --- | --- |")
    end, shown = None, 0
    for i, e in enumerate(events):
        gap = e["ts"] - end if end is not None else 0.0
        end = max(end or 0.0, e["ts"] + e["dur"])
        outside = e["cat"] != "kernel" or "argmax" in e["name"] or "index" in e["name"].lower()
        if outside and i > len(events) // 2 and shown < 8:  # a few from the middle
            print(f"| {e['name'][:60]} | {e['dur']:.2f} | {gap:.2f} |")
            shown += 1


def time_cuda_ms(fn, iters: int = 100) -> float:
    for _ in range(3):
        fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / iters


def decode_attention_ms(batch: int, context: int, width_tokens: int) -> dict[str, float]:
    """One layer's decode attention (14 query / 2 KV heads of 64, bf16), each variant replayed in a CUDA graph."""
    block_size, heads, kv_heads, dim = 16, 14, 2, 64
    blocks_per_seq = width_tokens // block_size
    k_cache = torch.randn(batch * blocks_per_seq * block_size, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(batch * blocks_per_seq, device="cuda").view(batch, blocks_per_seq)
    lens = torch.full((batch,), context, device="cuda")
    q = torch.randn(batch, heads, dim, device="cuda", dtype=torch.bfloat16)
    meta = AttentionMetadata(torch.zeros(batch, dtype=torch.int64, device="cuda"), tables, lens, torch.ones_like(lens), 1, block_size)
    sdpa = SdpaBackend()
    sdpa.prepare(meta)  # slot indices and mask: built once per step, shared by the layers
    variants = {
        "sdpa": lambda: sdpa.attend(q, None, None, k_cache, v_cache, meta, dim**-0.5),
        "one": lambda: paged_decode_attention(q, k_cache, v_cache, tables, lens, block_size, dim**-0.5, 1),
        "auto": lambda: paged_decode_attention(q, k_cache, v_cache, tables, lens, block_size, dim**-0.5),
    }
    ms = {}
    for name, fn in variants.items():
        fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        ms[name] = time_cuda_ms(graph.replay)
    return ms


def decode_attention_kernel_table(batches: list[int], context: int, width_tokens: int = 1024) -> None:
    print(f"decode attention alone, one layer, context {context} in a {width_tokens}-token block table:")
    print("| batch | sdpa (gather + masked SDPA) ms | triton 1 split ms | triton auto splits ms | sdpa / triton auto |")
    print("| --- | --- | --- | --- | --- |")
    for b in batches:
        ms = decode_attention_ms(b, context, width_tokens)
        print(f"| {b} | {ms['sdpa']:.4f} | {ms['one']:.4f} | {ms['auto']:.4f} | {ms['sdpa'] / ms['auto']:.1f}x |", flush=True)


def build_engine(path: str, sizes: tuple[int, ...], attention: str, cuda_graphs: bool = True, overlap_decode: bool = True,
                 kv_cache_bytes: int = 8 << 30) -> AREngine:
    """The benchmark's bf16 engine: graphs for ``sizes`` sequences and 1024-token block tables."""
    return AREngine.from_pretrained(
        path, device="cuda", dtype=torch.bfloat16, max_num_seqs=max(sizes), max_model_len=2048, kv_cache_bytes=kv_cache_bytes,
        cuda_graphs=cuda_graphs, cuda_graph_sizes=sizes, cuda_graph_kv_lens=(1024,), attention_backend=attention, overlap_decode=overlap_decode,
    )


def ab_table(path: str, spec: str, batches: list[int], attention: str, context: int, steps: int, vocab: int, rounds: int = 3) -> None:
    """Overlapped graph step ms of one engine per value of an environment variable, alternating."""
    var, values = spec.split("=", 1)
    engines = {}
    for value in values.split("|"):
        os.environ[var] = value
        for settings in (launch.launch_options, fused_linear.tile_override):
            settings.cache_clear()
        engines[value] = build_engine(path, tuple(batches), attention, kv_cache_bytes=2 << 30)
    print(f"| batch | {var} | " + " | ".join(f"round {r + 1} step ms (replay ms)" for r in range(rounds)) + " |")
    print("| --- " * (2 + rounds) + "|")
    for b in batches:
        cells = {value: [] for value in engines}
        for _ in range(rounds):
            for value, engine in engines.items():
                step, replay = decode_step_ms(engine, b, context, steps, vocab)
                cells[value].append(f"{step:.3f} ({replay:.3f})" if replay is not None else f"{step:.3f}")
        for value, row in cells.items():
            print(f"| {b} | {value} | " + " | ".join(row) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--vocab", type=int, default=6761)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--throughput-batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--attention", nargs="+", default=["sdpa", "triton"], choices=["sdpa", "triton-unfused", "triton"])
    parser.add_argument("--host-profile", type=int, metavar="N", help="also profile N engine steps at batch 1 (graphs, last backend) and print where the host time goes")
    parser.add_argument("--replay-trace", metavar="DIR", help="also write a kernel trace of the decode graph of each Triton backend to DIR and summarize it")
    parser.add_argument("--trace-batches", type=int, nargs="+", default=[1], help="the batch sizes --replay-trace traces")
    parser.add_argument("--step-gaps", metavar="DIR", help="also trace overlapped engine steps at batch 1 (last backend) into DIR and show what runs between replays")
    parser.add_argument("--decode-step-phases", type=int, metavar="N", help="only print the phases of the one-kernel batch-1 decode over N eager steps")
    parser.add_argument("--ab", metavar="VAR=A|B", help="only time overlapped graph steps of engines built under each value of VAR ('|' between values), alternating (last --attention backend)")
    args = parser.parse_args()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, transformers {transformers.__version__}")
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth: {bandwidth / 1e12:.2f} TB/s (read + write)")
    if any(a.startswith("triton") for a in args.attention) and not (args.ab or args.decode_step_phases):
        print()
        try:
            decode_attention_kernel_table(args.batches, args.context)
        except Exception as exc:  # report and go on: the engine tables still compare what builds
            print(f"decode attention table failed: {exc!r}")
    sizes = tuple(sorted(set(args.batches + args.throughput_batches)))
    with tempfile.TemporaryDirectory() as tmp:
        hf = make_checkpoint(tmp, args.vocab)
        if args.decode_step_phases:
            del hf
            decode_step_phases(tmp, args.context, args.decode_step_phases, args.vocab)
            return
        if args.ab:
            del hf
            ab_table(tmp, args.ab, args.batches, args.attention[-1], args.context, args.steps, args.vocab)
            return
        engines = {}
        for backend in list(args.attention):
            for mode in ("eager", "graphs", "graphs, step by step"):
                t = time.perf_counter()
                try:
                    engines[backend, mode] = engine = build_engine(tmp, sizes, backend, cuda_graphs=(mode != "eager"),
                                                                   overlap_decode=(mode != "graphs, step by step"))
                except Exception as exc:  # report and measure the other backend
                    print(f"{backend} {mode} engine failed: {exc!r}")
                    args.attention.remove(backend)
                    break
                print(f"{backend} {mode} engine ready in {time.perf_counter() - t:.1f} s ({len(engine.runner.graphs)} graphs)")
        model = engines[args.attention[0], "eager"].model
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        spec = model.kv_cache_spec
        kv_per_token = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 2
        print(f"weights {weight_bytes / 1e6:.0f} MB; KV {kv_per_token} B/token")
        for backend in args.attention:
            try:
                count = kernels_per_decode_step(engines[backend, "eager"], args.context, args.vocab)
                print(f"{backend}: {count} kernels per decode step ({count / spec.num_layers:.1f} per layer, head and sampling included)")
            except Exception as exc:  # the profiler is optional here
                print(f"{backend}: kernel count unavailable ({exc})")
        print()
        print("| batch | attention | roofline ms | eager step ms | graph step ms, step by step | graph step ms, overlapped | graph replay ms (model only) | graph step % of roofline |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for b in args.batches:
            roof = (weight_bytes + b * (args.context + 30) * kv_per_token) / bandwidth * 1e3
            for backend in args.attention:
                eager, _ = decode_step_ms(engines[backend, "eager"], b, args.context, args.steps, args.vocab)
                sync, _ = decode_step_ms(engines[backend, "graphs, step by step"], b, args.context, args.steps, args.vocab)
                graph, replay = decode_step_ms(engines[backend, "graphs"], b, args.context, args.steps, args.vocab)
                replay_s = f"{replay:.3f}" if replay is not None else "-"
                print(f"| {b} | {backend} | {roof:.3f} | {eager:.3f} | {sync:.3f} | {graph:.3f} | {replay_s} | {100 * roof / graph:.0f}% |", flush=True)
        if args.replay_trace:
            for backend in args.attention:
                if backend.startswith("triton"):
                    for b in args.trace_batches:
                        replay_trace(engines[backend, "graphs"], args.context, 20, f"{args.replay_trace}/{backend}-b{b}.json", b)
        if args.host_profile:
            host_profile(engines[args.attention[-1], "graphs"], args.context, args.host_profile, args.vocab)
        if args.step_gaps:
            step_gaps(engines[args.attention[-1], "graphs"], args.context, 20, f"{args.step_gaps}/steps-b1.json")
        print()
        names = " | ".join(f"{backend} (graphs) tok/s" for backend in args.attention)
        print(f"| batch | prompt | new tokens | {names} | transformers generate tok/s | {args.attention[-1]} / transformers |")
        print("| --- " * (5 + len(args.attention)) + "|")
        for b in args.throughput_batches:
            ours = {}
            for backend in args.attention:
                ours[backend], theirs = tokens_per_second(engines[backend, "graphs"], hf if backend == args.attention[-1] else None, b, args.context, args.new_tokens, args.vocab)
            cells = " | ".join(f"{ours[backend]:.0f}" for backend in args.attention)
            print(f"| {b} | {args.context} | {args.new_tokens} | {cells} | {theirs:.0f} | {ours[args.attention[-1]] / theirs:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
