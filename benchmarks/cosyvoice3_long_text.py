"""CosyVoice3 on a long text spoken in segments: time to first audio and audio seconds per wall
second with 0, 1 or 2 segments running ahead of the one being streamed (``SegmentedHandle``'s
``ahead``; ``Omni.submit`` uses 1), against one sentence alone.

Random weights stop at random, so the speech LM's length ratios are pinned (4-6 speech tokens a
text token): every segment then speaks about as long as a real one would. One process; the
first round also pays the graph captures of new batch sizes, so later rounds are the ones to
read.

    python benchmarks/cosyvoice3_long_text.py --preset full --device cuda --rounds 2
    python benchmarks/cosyvoice3_long_text.py --preset tiny --device cpu --rounds 2
"""

from __future__ import annotations

import argparse
import tempfile
import time

from omni_core.api import Omni
from omni_core.pipeline import SegmentedHandle
from omni_cosyvoice3.segments import split_speech

SENTENCES = [
    "The morning train left the station a few minutes late, and the passengers settled in for the long ride north.",
    "Outside the windows, the fields were still wet from the night's rain, and a thin mist hung over the river.",
    "A child near the back asked her father how many bridges they would cross before lunch.",
    "He guessed seven, then eight, and then admitted that he had never counted them before.",
    "The conductor passed through the carriage, checking tickets and answering questions about the connections.",
    "Somewhere past the second town, the clouds broke apart and sunlight spilled across the hills.",
    "By the time the train reached the coast, almost everyone had forgotten about the delay.",
    "They stepped onto the platform into the smell of salt and the sound of gulls circling over the harbour.",
]


def timed(handle, rate: int) -> tuple[float, float, float]:
    """(seconds to the first audio, wall seconds, audio seconds) of reading ``handle`` to its end."""
    start, first, samples = time.perf_counter(), None, 0
    for event in handle:
        audio = event.payload.get("audio") if event.name == "audio" else None
        if audio is not None and len(audio):
            first = first or time.perf_counter() - start
            samples += len(audio)
    return first or 0.0, time.perf_counter() - start, samples / rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="full")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ahead", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    text = " ".join(SENTENCES * 2)
    options = {"dtype": "bfloat16" if args.device.startswith("cuda") else "float32", "min_token_text_ratio": 4, "max_token_text_ratio": 6,
               "min_length_blocks": "all"}
    with Omni("cosyvoice3", preset=args.preset, device=args.device, options=options, cache_dir=tempfile.mkdtemp()) as omni:
        rate = omni.sample_rate
        for _ in range(2):  # warm-up
            omni.speech(SENTENCES[0], voice="default", seed=1)
        parts = split_speech(omni.checkpoint_dir, omni.speech_inputs(text, "default", seed=3))
        print(f"{len(text)} characters in {len(parts)} segments; {args.preset} preset on {args.device}")
        print("| round | request | first audio ms | wall s | audio s | audio s / wall s |")
        print("| --- | --- | --- | --- | --- | --- |")
        for round_ in range(1, args.rounds + 1):
            runs = [("one sentence", lambda: omni.pipeline.submit(omni.speech_inputs(SENTENCES[0], "default", seed=3)))]
            runs += [(f"{len(parts)} segments, {n} ahead", lambda n=n: SegmentedHandle(omni.pipeline, parts, ahead=n)) for n in args.ahead]
            for name, make in runs:
                first, wall, audio = timed(make(), rate)
                print(f"| {round_} | {name} | {first * 1e3:.0f} | {wall:.2f} | {audio:.1f} | {audio / wall:.1f} |", flush=True)


if __name__ == "__main__":
    main()
