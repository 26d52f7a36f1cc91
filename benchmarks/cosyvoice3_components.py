"""Where CosyVoice3's time goes: each stage's model alone, at batch sizes 1, 8 and 32.

- llm: one engine decode step (the core AR engine, CUDA graphs where available) with the RAS
  ``sample`` hook, and with the engine's own sampler, side by side;
- flow: one chunk call (10 Euler steps x CFG) over 56 and 256 mel frames per request;
- hift: one vocoder pass over 56 and 256 mel frames per request.

On CUDA the flow and HiFT rows are timed eagerly and through their bucketed CUDA graphs (frame
buckets 64,128,256,512,1024; the batch is its own bucket), side by side, with the ratio.

    python benchmarks/cosyvoice3_components.py --preset full --device cuda --dtype bfloat16
    python benchmarks/cosyvoice3_components.py --preset full --device cuda --dtype bfloat16 --skip-llm
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str, repeat: int = 5) -> float:
    fn()
    _sync(device)
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / repeat * 1000


def llm_step_ms(directory: str, device: str, dtype: torch.dtype, batch: int, ras: bool) -> float:
    from omni_core.scheduler.engine import AREngine, EngineConfig, EngineRequest
    from omni_core.scheduler.sampling_params import SamplingParams
    from omni_cosyvoice3.checkpoint import load_llm
    from omni_cosyvoice3.llm_stage import RasHooks

    model = load_llm(directory).to(device=device, dtype=dtype)
    engine = AREngine(
        model,
        EngineConfig(max_num_seqs=max(batch, 1), dtype=dtype, kv_cache_bytes=2 << 30),
        hooks=RasHooks(model.cfg) if ras else None,
        device=device,
    )
    prompt = model.prompt_embeds(list(range(5, 45)), [])
    for i in range(batch):
        extras = {"ras": {"top_p": 0.8, "top_k": 25, "temperature": 1.0, "seed": i, "min_tokens": 10_000}}
        params = SamplingParams(max_tokens=600, min_tokens=0, top_k=25, top_p=0.8, seed=i)
        engine.add_request(EngineRequest(f"r{i}", prompt_embeds=prompt, params=params, extras=extras))
    for _ in range(20):  # prefill, then warm decode (graph capture)
        engine.step()
    _sync(device)
    steps = 50
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    _sync(device)
    return (time.perf_counter() - start) / steps * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", choices=["tiny", "full"], default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--json")
    parser.add_argument("--skip-llm", action="store_true", help="time only the flow and HiFT")
    args = parser.parse_args()
    from omni_cosyvoice3.checkpoint import load_flow, load_hift
    from omni_cosyvoice3.flow import FlowRequest
    from omni_cosyvoice3.presets import write_random_checkpoint

    device = "cuda:0" if args.device == "cuda" else args.device
    dtype = getattr(torch, args.dtype)
    directory = write_random_checkpoint(
        Path(tempfile.gettempdir()) / f"omni-bench-cosyvoice3-{args.preset}", args.preset
    )
    rows = []
    for batch in [] if args.skip_llm else args.batches:
        rows.append(
            {
                "part": "llm decode step, RAS hook",
                "batch": batch,
                "ms": llm_step_ms(directory, device, dtype, batch, True),
            }
        )
        rows.append(
            {
                "part": "llm decode step, engine sampler",
                "batch": batch,
                "ms": llm_step_ms(directory, device, dtype, batch, False),
            }
        )
        print(json.dumps(rows[-2:]), flush=True)
    flow = load_flow(directory).to(device=device, dtype=dtype)
    hift = load_hift(directory).to(device=device)
    graphs = device.startswith("cuda")
    frame_buckets = (64, 128, 256, 512, 1024)
    for frames in (56, 256):
        for batch in args.batches:
            tokens = frames // 2 + 3
            reqs = [
                FlowRequest(
                    torch.randint(0, 6561, (tokens,)), 0, torch.zeros(0, 80), torch.randn(192), False, True
                )
                for _ in range(batch)
            ]
            mels = [torch.randn(80, frames) - 4 for _ in range(batch)]
            for part, model, call in (
                ("flow chunk", flow, lambda reqs=reqs: flow.infer(reqs)),
                ("hift", hift, lambda mels=mels: hift.infer(mels)),
            ):
                model.graphs = None
                row = {"part": f"{part}, {frames} frames", "batch": batch, "ms": timed(call, device)}
                if graphs:
                    model.use_graphs(batches=(batch,), frames=frame_buckets)
                    row["graph_ms"] = timed(call, device)
                    row["capture_s"] = model.graphs.capture_seconds
                    model.graphs = None
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"\n{args.preset} preset, {args.device}, {args.dtype}")
    print("| part | batch | eager ms | graph ms | eager / graph |\n| --- | --- | --- | --- | --- |")
    for r in rows:
        graph = f"{r['graph_ms']:.1f} | {r['ms'] / r['graph_ms']:.1f}x" if "graph_ms" in r else "- | -"
        print(f"| {r['part']} | {r['batch']} | {r['ms']:.1f} | {graph} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
