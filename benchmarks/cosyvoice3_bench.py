"""CosyVoice3 pipeline: time to first audio and real-time factor at several concurrencies.

Runs the family's topology in-process (frontend -> llm on the AR engine -> flow -> hift) on a
random-weight checkpoint in the official layout: ``--preset tiny`` (CPU-sized) or ``--preset
full`` (the real sizes). For each concurrency ``c`` it starts ``c`` requests at once, ``--rounds``
times (after one warm-up round), and reports per request: time to first audio (TTFA), latency,
audio seconds and RTF = latency / audio seconds; and for the level, throughput RTF = wall time /
total audio seconds. Random weights stop at random, so ``--min-ratio`` sets how many speech
tokens per text token a request makes at least (default 2, the model's own).

``--trace`` also reports, per level, when each request's stages first produced something (mean
ms after submit): frontend done, first llm token, first token chunk sent to the flow, first mel
out of the flow, first audio out of HiFT, first audio at the client. It wraps the stage workers'
``emit`` in this process (in-process placement only).

    python benchmarks/cosyvoice3_bench.py --preset tiny --device cpu --concurrency 1 8 32
    python benchmarks/cosyvoice3_bench.py --preset full --device cuda --dtype bfloat16 --min-ratio 8
    python benchmarks/cosyvoice3_bench.py --preset tiny --device cpu --concurrency 1 --trace
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import torch

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs back home across the quiet field."


def _percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


TRACE_STAGES = ("frontend", "llm first token", "llm first chunk", "flow first mel", "hift first audio")


def install_trace() -> dict[str, dict[str, float]]:
    """Wrap the stage workers so each stage's first output per request id gets a timestamp."""
    from omni_cosyvoice3.llm_stage import SpeechTokenWorker
    from omni_cosyvoice3.stage_workers import FlowWorker, FrontendWorker, HiftWorker

    marks: dict[str, dict[str, float]] = defaultdict(dict)

    def stamp(stage: str, request_id: str) -> None:
        marks[stage].setdefault(request_id, time.perf_counter())

    frontend_call = FrontendWorker.__call__

    def frontend(self, message, emit):
        frontend_call(self, message, emit)
        stamp("frontend", message.request_id)

    on_output = SpeechTokenWorker.on_output

    def llm(self, request_id, new_token_ids, finished, step_outputs, emit):
        if new_token_ids:
            stamp("llm first token", request_id)

        def traced(port, payload, end=False):
            if payload.get("token_ids"):
                stamp("llm first chunk", request_id)
            return emit(port, payload, end=end)

        return on_output(self, request_id, new_token_ids, finished, step_outputs, traced)

    def wrap(cls, stage: str, key: str):
        process = cls.process

        def traced_process(self, messages, emit):
            def traced(request_id, port, payload, end=False):
                if payload.get(key) is not None and payload[key].numel():
                    stamp(stage, request_id)
                return emit(request_id, port, payload, end=end)

            return process(self, messages, traced)

        cls.process = traced_process

    FrontendWorker.__call__ = frontend
    SpeechTokenWorker.on_output = llm
    wrap(FlowWorker, "flow first mel", "mel")
    wrap(HiftWorker, "hift first audio", "audio")
    return marks


def run_level(pipeline, concurrency: int, rounds: int, seed0: int, marks: dict | None = None) -> dict:
    records: list[dict] = []
    wall, audio_total = 0.0, 0.0
    for r in range(rounds):
        results: list[dict] = [{} for _ in range(concurrency)]

        def one(i: int, r: int = r, results: list = results) -> None:
            inputs = {
                "task": "speech",
                "text": TEXT,
                "voice": "default",
                "instructions": None,
                "speed": 1.0,
                "seed": seed0 + r * 1000 + i,
                "sampling": {},
                "reference_audio": None,
                "reference_sample_rate": None,
                "reference_text": None,
            }
            start = time.perf_counter()
            first, samples = None, 0
            handle = pipeline.submit(inputs)
            for event in handle:
                if event.name == "audio" and event.payload.get("audio") is not None:
                    n = int(event.payload["audio"].numel())
                    if n and first is None:
                        first = time.perf_counter() - start
                    samples += n
            results[i] = {
                "ttfa": first,
                "latency": time.perf_counter() - start,
                "audio_s": samples / 24000,
                "rid": handle.request_id,
                "start": start,
            }

        threads = [threading.Thread(target=one, args=(i,)) for i in range(concurrency)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall += time.perf_counter() - t0
        audio_total += sum(x["audio_s"] for x in results)
        records.extend(results)
    ttfa = [x["ttfa"] for x in records if x["ttfa"] is not None]
    rtf = [x["latency"] / x["audio_s"] for x in records if x["audio_s"] > 0]
    trace = {}
    if marks is not None:
        for stage in TRACE_STAGES:
            times = [marks[stage][x["rid"]] - x["start"] for x in records if x["rid"] in marks[stage]]
            trace[stage] = 1000 * statistics.mean(times) if times else None
        trace["client first audio"] = 1000 * statistics.mean(ttfa)
    return {
        "trace_ms": trace,
        "concurrency": concurrency,
        "requests": len(records),
        "ttfa_ms_mean": 1000 * statistics.mean(ttfa),
        "ttfa_ms_p50": 1000 * _percentile(ttfa, 0.5),
        "ttfa_ms_p90": 1000 * _percentile(ttfa, 0.9),
        "rtf_mean": statistics.mean(rtf),
        "rtf_p90": _percentile(rtf, 0.9),
        "throughput_rtf": wall / audio_total,
        "audio_s_mean": audio_total / len(records),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", choices=["tiny", "full"], default="tiny")
    parser.add_argument("--checkpoint", help="an existing checkpoint directory instead of writing the preset")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", help="flow and llm dtype")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--min-ratio", type=float, default=2.0, help="min speech tokens per text token")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--trace", action="store_true", help="per-stage times to first output")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="a build option")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from omni_core.hooks import get_plugin_manager
    from omni_core.pipeline import Pipeline
    from omni_cosyvoice3.presets import write_random_checkpoint
    from omni_cosyvoice3.topology import build

    directory = args.checkpoint or write_random_checkpoint(
        Path(tempfile.gettempdir()) / f"omni-bench-cosyvoice3-{args.preset}", args.preset
    )
    options = {
        "dtype": args.dtype,
        "max_batch": max(args.concurrency),
        "min_token_text_ratio": args.min_ratio,
        "min_length_blocks": "all",  # random weights: every stop id waits for the minimum length
    }
    for item in args.option:
        key, _, value = item.partition("=")
        options[key] = value
    marks = install_trace() if args.trace else None
    device = "cuda:0" if args.device == "cuda" else args.device
    pipeline = Pipeline(build(directory, options), device=device, plugin_manager=get_plugin_manager()).start()
    try:
        run_level(pipeline, 1, 1, seed0=99)  # warm-up: first calls, CUDA graph capture
        results = []
        for c in args.concurrency:
            if c > 1:
                run_level(pipeline, c, 1, seed0=98)  # warm-up of this batch size
            res = run_level(pipeline, c, args.rounds, seed0=1, marks=marks)
            results.append(res)
            print(json.dumps(res), flush=True)
    finally:
        pipeline.shutdown()
    header = f"{args.preset} preset, {args.device}, {args.dtype}, min ratio {args.min_ratio}"
    print(
        f"\n{header}\n| concurrency | TTFA mean / p90 (ms) | RTF mean / p90 | throughput RTF | audio per request (s) |"
    )
    print("| --- | --- | --- | --- | --- |")
    for r in results:
        print(
            f"| {r['concurrency']} | {r['ttfa_ms_mean']:.0f} / {r['ttfa_ms_p90']:.0f} | {r['rtf_mean']:.3f} / "
            f"{r['rtf_p90']:.3f} | {r['throughput_rtf']:.3f} | {r['audio_s_mean']:.1f} |"
        )
    if marks is not None:
        print("\n| concurrency | " + " | ".join(TRACE_STAGES) + " | client first audio |")
        print("| --- " * (len(TRACE_STAGES) + 2) + "|")
        for r in results:
            cells = [f"{v:.0f}" if v is not None else "-" for v in r["trace_ms"].values()]
            print(f"| {r['concurrency']} | " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({"setup": header, "results": results}, indent=2))


if __name__ == "__main__":
    main()
