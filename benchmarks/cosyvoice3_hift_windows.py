"""HiFT's work on a streamed CosyVoice3 reply: windows of each stream (the stage's way) against
re-running the whole mel every chunk (the reference's way).

B streams start together (a burst) and receive the flow's mel chunks at its schedule (a
``--prompt``-token prompt, hops of 25 tokens doubling to 100, 2 mel frames a token) until
``--seconds`` of audio; each chunk of all B streams is one call. Windows: the stage's
``HiftWorker`` (a call runs from 32 frames before the first sample it sends, the excitation's
phase carried). Whole: every call vocodes each stream's whole mel so far and sends the samples
past those already sent. Per mode: vocoded frames (all rows of all calls), wall seconds
(synchronised), and the largest difference between the two modes' audio. Random full-size
weights (512 channels), float32 as the stage runs it by default; one untimed round first.

    python benchmarks/cosyvoice3_hift_windows.py --device cpu --streams 1 --seconds 17
    python benchmarks/cosyvoice3_hift_windows.py --device cuda --streams 1 8 32 --seconds 17
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def chunk_frames(prompt: int, seconds: float, hop: int = 25, max_hop: int = 100, ratio: int = 2) -> list[int]:
    """Mel frames of each flow chunk of a reply of ``seconds`` (50 frames a second)."""
    from omni_cosyvoice3.chunking import due_points

    total, ends, lookahead = int(seconds * 50) // ratio, [], 3
    for due in due_points(prompt, hop, max_hop, lookahead):
        if due - lookahead >= total:
            break
        ends.append(due - lookahead)
    ends.append(total)
    return [ratio * (b - a) for a, b in zip([0, *ends], ends, strict=False)]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_windows(model, mels: list[torch.Tensor], chunks: list[int], device: str) -> tuple[list[torch.Tensor], int, float]:
    from omni_core.pipeline import Message
    from omni_cosyvoice3.stage_workers import HiftWorker

    worker, audio = HiftWorker(model), {i: [] for i in range(len(mels))}
    frames, infer = [0], model.infer_windows

    def counted(windows):
        frames[0] += sum(int(w.mel.shape[1]) for w in windows)
        return infer(windows)

    model.infer_windows = counted
    _sync(device)
    start, at = time.perf_counter(), 0
    try:
        for seq, n in enumerate(chunks):
            end = seq == len(chunks) - 1
            batch = [Message(str(i), "mel", {"mel": m[:, at : at + n]}, end, seq) for i, m in enumerate(mels)]
            worker.process(batch, lambda rid, port, payload, end=True: audio[int(rid)].append(payload["audio"]))
            at += n
        _sync(device)
    finally:
        model.infer_windows = infer
    return [torch.cat(audio[i]) for i in range(len(mels))], frames[0], time.perf_counter() - start


def run_whole(model, mels: list[torch.Tensor], chunks: list[int], device: str) -> tuple[list[torch.Tensor], int, float]:
    sent, audio, frames = 0, [[] for _ in mels], 0
    _sync(device)
    start, at = time.perf_counter(), 0
    for seq, n in enumerate(chunks):
        at += n
        stable = model.stable_samples(at, seq == len(chunks) - 1)
        outs = model.infer([m[:, :at] for m in mels])
        frames += at * len(mels)
        # the new samples of every stream to the host in one copy, as the stage's worker does
        host = torch.cat([out[sent:stable] for out in outs]).cpu().split(stable - sent)
        for i, piece in enumerate(host):
            audio[i].append(piece)
        sent = stable
    _sync(device)
    return [torch.cat(a) for a in audio], frames, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--streams", type=int, nargs="+", default=[1])
    parser.add_argument("--seconds", type=float, default=17.0)
    parser.add_argument("--prompt", type=int, default=100, help="prompt tokens (the first hop pads to a multiple of 25)")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()

    from omni_cosyvoice3.config import HiftConfig
    from omni_cosyvoice3.hift import HiftGenerator

    torch.manual_seed(0)
    model = HiftGenerator(HiftConfig()).to(args.device).eval()
    with torch.no_grad():  # random weights predict ~0 Hz: a voiced pitch, so the phase is exercised
        model.f0_predictor.classifier.weight.mul_(400)
        model.f0_predictor.classifier.bias.fill_(220)
    chunks = chunk_frames(args.prompt, args.seconds)
    rows = []
    for streams in args.streams:
        gen = torch.Generator().manual_seed(streams)
        mels = [torch.randn(80, sum(chunks), generator=gen) * 0.5 - 4 for _ in range(streams)]
        run_windows(model, mels, chunks, args.device)  # untimed: kernel selection, allocations
        windows, window_frames, window_s = run_windows(model, mels, chunks, args.device)
        whole, whole_frames, whole_s = run_whole(model, mels, chunks, args.device)
        diff = max(float((a.cpu() - b).abs().max()) for a, b in zip(windows, whole, strict=True))
        row = {
            "streams": streams, "chunks": chunks, "window_frames": window_frames, "whole_frames": whole_frames,
            "window_s": round(window_s, 3), "whole_s": round(whole_s, 3), "max_abs_diff": diff,
        }  # fmt: skip
        rows.append(row)
        print(
            f"{streams} streams, {len(chunks)} calls: frames vocoded {whole_frames} -> {window_frames} "
            f"({whole_frames / window_frames:.2f}x), wall {whole_s:.2f} -> {window_s:.2f} s "
            f"({whole_s / window_s:.2f}x), largest difference {diff:.1e}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
