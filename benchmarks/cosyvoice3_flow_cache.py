"""A streamed CosyVoice3 request's flow calls with and without the cache of finished chunks.

B streams start together (a burst): each gets a prompt of ``--prompt`` tokens and ``--tokens``
generated tokens, fed to the flow stage's worker exactly at its chunk points (hop 25 doubling to
100, 3 lookahead tokens), all B in one call; the last call (full attention) follows the last
token. The whole schedule runs once to warm up (graph capture, the cache's pool), then once
timed, without the cache and with it (and with ``--masked-last`` with the cache and the last
call under the chunk mask, ``flow_last_call=masked``). Per call: wall ms (synchronised), the DiT's query frames
per request (all frames so far without the cache, the new frames with it) and its key frames.

On CUDA the uncached path runs as the stage runs it: bucketed CUDA graphs (the topology's
default buckets; batch x frames past 8192 eager); the cached path runs eagerly, and with
``--cache-graphs`` also as graphs of its own (``flow_cache_graphs=true``; the masked-last mode
then uses them too). The warm-up run captures the buckets the timed runs replay.

    python benchmarks/cosyvoice3_flow_cache.py --preset full --device cuda --dtype bfloat16 --streams 1 8 32 --masked-last --cache-graphs
    python benchmarks/cosyvoice3_flow_cache.py --preset tiny --streams 1 8   # CPU
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from pathlib import Path

import torch


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def schedule(prompt: int, tokens: int, hop: int = 25, max_hop: int = 100, lookahead: int = 3) -> list[int]:
    """Generated-token counts at which the flow runs: each chunk's due point, then the end."""
    from omni_cosyvoice3.chunking import due_points

    points = []
    for due in due_points(prompt, hop, max_hop, lookahead):
        if due >= tokens:
            break
        points.append(due)
    return points + [tokens]


def watch_reserve(cache) -> tuple[dict[str, bool], set[str]]:
    """Record the cache's answers: the last per request (did its call run on the cache), and
    every request it refused."""
    answers, refused = {}, set()
    reserve = cache.reserve

    def watched(request_id, frames, last=False):
        answers[request_id] = ok = reserve(request_id, frames, last)
        if not ok and request_id in cache.refused:
            refused.add(request_id)
        return ok

    cache.reserve = watched
    return answers, refused


def run_streams(worker, streams, prompt, tokens, device, seed, answers) -> list[dict]:
    """One burst of ``streams`` requests through ``worker``; a row per flow call (ids are new per
    seed: the worker ignores messages of requests it has released)."""
    from omni_core.scheduler.executor import Message

    gen = torch.Generator().manual_seed(seed)
    requests = {
        f"{seed}-{i}": {
            "prompt": torch.randint(0, 6561, (prompt,), generator=gen).tolist(),
            "generated": torch.randint(0, 6561, (tokens,), generator=gen).tolist(),
        }
        for i in range(streams)
    }
    conds = [
        Message(
            rid,
            "cond",
            {
                "prompt_tokens": r["prompt"],
                "prompt_mel": torch.randn(2 * prompt, 80, generator=gen),
                "embedding": torch.randn(192, generator=gen),
                "streaming": True,
            },
            seq=0,
        )
        for rid, r in requests.items()
    ]
    worker.process(conds, lambda *a, **k: None)
    rows, sent = [], 0
    for seq, point in enumerate(schedule(prompt, tokens), start=1):
        final = point == tokens
        cache = worker.cache
        first = f"{seed}-0"
        before = cache.cached_frames(first) if cache is not None else 0
        answers.pop(first, None)
        messages = [
            Message(rid, "tokens", {"token_ids": r["generated"][sent:point]}, end=final, seq=seq)
            for rid, r in requests.items()
        ]
        _sync(device)
        start = time.perf_counter()
        worker.process(messages, lambda *a, **k: None)
        _sync(device)
        ms = (time.perf_counter() - start) * 1000
        held = 0 if final else 3
        keys = 2 * (prompt + point - held)
        queries = keys - before if answers.get(first) else keys
        rows.append({"call": seq, "tokens": point, "final": final, "ms": ms, "queries": queries, "keys": keys})
        sent = point
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=["tiny", "full"], default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt", type=int, default=100, help="prompt speech tokens (4 s)")
    parser.add_argument("--tokens", type=int, default=400, help="generated speech tokens (16 s)")
    parser.add_argument("--cache-gb", type=float, help="cache budget (default: what the streams need)")
    parser.add_argument("--no-graphs", action="store_true", help="uncached path eagerly on CUDA too")
    parser.add_argument("--masked-last", action="store_true", help="also time flow_last_call=masked")
    parser.add_argument("--cache-graphs", action="store_true", help="also time flow_cache_graphs=true (CUDA)")
    parser.add_argument("--repeat", type=int, default=1, help="timed runs; each call's fastest counts")
    parser.add_argument("--json")
    args = parser.parse_args()
    from omni_cosyvoice3.checkpoint import load_flow
    from omni_cosyvoice3.flow_cache import FlowCache
    from omni_cosyvoice3.graph_buckets import parse_buckets
    from omni_cosyvoice3.presets import write_random_checkpoint
    from omni_cosyvoice3.stage_workers import FlowWorker
    from omni_cosyvoice3.topology import DEFAULT_GRAPH_FRAMES, DEFAULT_GRAPH_MAX_WORK

    device = "cuda:0" if args.device == "cuda" else args.device
    directory = write_random_checkpoint(
        Path(tempfile.gettempdir()) / f"omni-bench-cosyvoice3-{args.preset}", args.preset
    )
    flow = load_flow(directory).to(device=device, dtype=getattr(torch, args.dtype))
    if device.startswith("cuda") and not args.no_graphs:
        top = max(args.streams)
        batches = parse_buckets([2**i for i in range(top.bit_length()) if 2**i < top] + [top])
        flow.use_graphs(batches, parse_buckets(DEFAULT_GRAPH_FRAMES), max_work=DEFAULT_GRAPH_MAX_WORK)
    frames = 2 * (args.prompt + args.tokens)
    results = []
    for streams in args.streams:
        probe = FlowCache(flow.cfg, 0, device, flow.dtype)
        need = streams * (frames + probe.block) * probe.frame_bytes
        budget = int(args.cache_gb * 2**30) if args.cache_gb else need
        modes = [("no cache", False, False, False), ("cache", True, False, False)]
        if args.cache_graphs:
            modes.append(("cache, graphs", True, False, True))
        if args.masked_last:
            modes.append(("cache, masked last", True, True, args.cache_graphs))
        for label, cached, masked_last, cache_graphs in modes:
            cache = FlowCache(flow.cfg, budget, device, flow.dtype, use_graphs=cache_graphs) if cached else None
            worker = FlowWorker(flow, hop=25, max_hop=100, cache=cache, masked_last=masked_last)
            answers, refused = watch_reserve(cache) if cache is not None else ({}, set())
            run_streams(worker, streams, args.prompt, args.tokens, device, 1, answers)  # warm-up
            refused.clear()
            runs = [
                run_streams(worker, streams, args.prompt, args.tokens, device, 2 + i, answers)
                for i in range(args.repeat)
            ]
            # each call's fastest run: the others are the machine's noise
            rows = [dict(calls[0], ms=min(c["ms"] for c in calls)) for calls in zip(*runs, strict=True)]
            result = {
                "streams": streams,
                "mode": label,
                "calls": rows,
                "chunk_ms": sum(r["ms"] for r in rows if not r["final"]),
                "final_ms": sum(r["ms"] for r in rows if r["final"]),
                "query_frames": sum(r["queries"] for r in rows),
                "refused": len(refused),
                "cache_gb": round(budget / 2**30, 2) if cache is not None else 0,
            }
            results.append(result)
            # the pool and its watcher refer to each other: free it before the next mode's
            del cache, worker, answers, refused
            gc.collect()
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
            print(json.dumps({k: v for k, v in result.items() if k != "calls"}), flush=True)
    audio_s = args.tokens / 25
    print(f"\n{args.preset} preset, {args.device}, {args.dtype}: prompt {args.prompt} tokens, {args.tokens} generated ({audio_s:.0f} s)")
    print("| streams | mode | calls | query frames / request | chunk calls ms | last call ms | flow ms / audio s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        total = r["chunk_ms"] + r["final_ms"]
        refused = f" ({r['refused']} refused)" if r["refused"] else ""
        print(
            f"| {r['streams']} | {r['mode']}{refused} | "
            f"{len(r['calls'])} | {r['query_frames']} | {r['chunk_ms']:.0f} | {r['final_ms']:.0f} | {total / audio_s:.0f} |"
        )
    print("\nper call (ms, query frames / request), streams x mode:")
    for r in results:
        calls = ", ".join(f"{c['ms']:.0f} ({c['queries']})" for c in r["calls"])
        print(f"  {r['streams']} {r['mode']}: {calls}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
