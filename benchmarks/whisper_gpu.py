"""Whisper on one GPU: omni's whisper pipeline vs transformers ``generate`` on the same weights.

A large-v3-turbo-shaped checkpoint (encoder 32 layers, decoder 4, width 1280, 128 mel bins; the
multilingual token layout of the ``tiny-multilingual`` preset) with deterministic random weights,
written in the Hugging Face layout and loaded by both systems in float16. The clips are noise
(3-8 s, one 30 s window each); random weights decode every clip to the 224-token limit, so both
systems produce the same number of tokens per clip.
Concurrency N: omni gets N client threads calling ``Omni.transcribe`` (the pipeline batches
them); transformers ``generate`` gets batches of N clips. Reported: audio seconds per wall second
and output tokens per second, best of the rounds, rounds interleaved. ``--timestamps`` decodes
with timestamps in both (segments; transformers ``return_timestamps=True``).

    python benchmarks/whisper_gpu.py --concurrency 1 16 64 --clips 64 --rounds 2 [--timestamps]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from omni_core.api import Omni
from omni_whisper.checkpoint import WhisperCheckpoint, bundled_model_dir, write_hf_checkpoint
from omni_whisper.presets import multilingual_tokenizer
from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

TURBO = dict(d_model=1280, encoder_layers=32, decoder_layers=4, encoder_attention_heads=20, decoder_attention_heads=20,
             encoder_ffn_dim=5120, decoder_ffn_dim=5120, num_mel_bins=128, vocab_size=51865,
             decoder_start_token_id=50258, pad_token_id=50257, bos_token_id=50257, eos_token_id=50257)
MAX_NEW_TOKENS = 224


def write_checkpoint(directory: Path) -> Path:
    english = json.loads((bundled_model_dir() / "tokenizer.json").read_text())
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(json.dumps(multilingual_tokenizer(english), ensure_ascii=False))
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = WhisperForConditionalGeneration(WhisperConfig(**TURBO))
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    del model
    checkpoint = WhisperCheckpoint(config=WhisperConfig(**TURBO), state_dict=state, tokenizer_dir=directory,
                                   suppress_ids=[], begin_suppress_ids=[220, 50257])
    return write_hf_checkpoint(checkpoint, directory, dtype=torch.float16)


def make_clips(count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [(0.1 * rng.standard_normal(int(16000 * rng.uniform(3, 8)))).astype(np.float32) for _ in range(count)]


def run_omni(omni: Omni, clips: list[np.ndarray], concurrency: int, timestamps: bool = False) -> tuple[float, int]:
    def one(clip):
        return omni.transcribe(clip, 16000, language="en", timestamps=timestamps).usage["output_tokens"]

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(one, clips))
    return time.perf_counter() - start, tokens


def run_transformers(model, extractor, clips: list[np.ndarray], concurrency: int, timestamps: bool = False) -> tuple[float, int]:
    start = time.perf_counter()
    tokens = 0
    for i in range(0, len(clips), concurrency):
        batch = clips[i : i + concurrency]
        features = extractor(batch, sampling_rate=16000, return_tensors="pt").input_features
        with torch.inference_mode():
            out = model.generate(features.to("cuda", torch.float16), language="en", task="transcribe",
                                 max_new_tokens=MAX_NEW_TOKENS, return_timestamps=timestamps)
        out = out["sequences"] if isinstance(out, dict) else out
        # text and timestamp tokens (no prompt, no padding)
        tokens += int(((out < model.generation_config.eos_token_id) | (out > model.generation_config.no_timestamps_token_id)).sum())
    torch.cuda.synchronize()
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--clips", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timestamps", action="store_true", help="decode with timestamps (segments)")
    args = parser.parse_args()
    clips = make_clips(args.clips)
    seconds = sum(len(c) for c in clips) / 16000
    with tempfile.TemporaryDirectory() as tmp:
        path = write_checkpoint(Path(tmp) / "turbo")
        reference = WhisperForConditionalGeneration.from_pretrained(path, dtype=torch.float16).to("cuda").eval()
        extractor = WhisperFeatureExtractor(feature_size=128)
        with Omni(family="whisper", model=str(path), device="cuda",
                  options={"dtype": "float16", "max_batch": max(args.concurrency)}) as omni:
            run_omni(omni, clips[:4], 4)  # warm-up (kernels, allocator)
            run_transformers(reference, extractor, clips[:4], 4)
            best: dict[tuple[str, int], tuple[float, int]] = {}
            for _ in range(args.rounds):
                for n in args.concurrency:
                    for name, fn in (("omni", lambda n=n: run_omni(omni, clips, n, args.timestamps)),
                                     ("transformers", lambda n=n: run_transformers(reference, extractor, clips, n, args.timestamps))):
                        wall, tokens = fn()
                        if (name, n) not in best or wall < best[name, n][0]:
                            best[name, n] = (wall, tokens)
    print(f"{len(clips)} clips, {seconds:.1f} s of audio, {torch.cuda.get_device_name()}, timestamps {args.timestamps}")
    print("| concurrency | omni x real time | omni tokens/s | transformers x real time | transformers tokens/s | omni / transformers |")
    print("| --- | --- | --- | --- | --- | --- |")
    for n in args.concurrency:
        (ow, ot), (tw, tt) = best["omni", n], best["transformers", n]
        print(f"| {n} | {seconds / ow:.1f} | {ot / ow:.0f} | {seconds / tw:.1f} | {tt / tw:.0f} | {tw / ow:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
