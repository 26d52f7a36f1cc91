"""Throughput of Qwen3-ASR on MLX (omni's qwen3-asr pipeline) vs transformers' generate.

Both load the same random checkpoint (a small Qwen3-ASR configuration written with
save_pretrained) and transcribe the same clips with greedy decoding and a fixed number of new
tokens per clip (end-of-text disabled), so both do identical work. At concurrency C, omni gets C
requests submitted at once to its in-process pipeline (continuous batching); transformers gets
one batched ``generate`` call of C clips (equal-length clips: no padding). Reported: audio
seconds transcribed per wall second, and ours / transformers.

    python benchmarks/qwen3_asr_mlx.py [--concurrency 1 8 32] [--seconds 5] [--new-tokens 48] [--repeats 3]
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time

import numpy as np
import torch


def make_checkpoint(directory: str) -> str:
    from omni_qwen3_asr_mlx.presets import write_tiny

    return write_tiny(
        directory, seed=0, d_model=256, encoder_layers=4, encoder_ffn_dim=1024, conv_channels=64,
        hidden_size=512, intermediate_size=1536, decoder_layers=4,
    )


def clips(count: int, seconds: float) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [(0.1 * rng.standard_normal(int(seconds * 16000))).astype(np.float32) for _ in range(count)]


class OmniRunner:
    def __init__(self, checkpoint: str, new_tokens: int):
        from omni_core.pipeline import Pipeline
        from omni_qwen3_asr_mlx.topology import build_topology

        options = {"max_batch": 64, "min_new_tokens": new_tokens, "max_tokens_per_second": 0}
        self.pipeline = Pipeline(build_topology(checkpoint, options)).start()
        self.pipeline.executors["asr"].batcher.eos_ids = set()  # fixed-length outputs, as transformers below
        self.new_tokens = new_tokens

    def __call__(self, audios: list[np.ndarray]) -> float:
        start = time.perf_counter()
        handles = [self.pipeline.submit({"task": "transcription", "audio": a, "language": "en"}) for a in audios]
        for handle in handles:
            events = list(handle)
            assert events[-1].payload["usage"]["output_tokens"] == self.new_tokens
        return time.perf_counter() - start


class TransformersRunner:
    def __init__(self, checkpoint: str, new_tokens: int, audio: np.ndarray):
        from omni_qwen3_asr_mlx.frontend import Frontend
        from transformers import Qwen3ASRFeatureExtractor, Qwen3ASRForConditionalGeneration

        self.model = Qwen3ASRForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32).eval()
        self.extractor = Qwen3ASRFeatureExtractor()
        self.prompt = Frontend(checkpoint, {}).prepare({"audio": audio, "language": "en"})["prompt_ids"][0]
        self.new_tokens = new_tokens

    def __call__(self, audios: list[np.ndarray]) -> float:
        start = time.perf_counter()
        features = self.extractor(audios, sampling_rate=16000, padding=True, return_tensors="pt", return_attention_mask=True)
        ids = torch.tensor([self.prompt] * len(audios))
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), input_features=features["input_features"],
                input_features_mask=features["attention_mask"], do_sample=False, max_new_tokens=self.new_tokens,
                min_new_tokens=self.new_tokens, eos_token_id=None, pad_token_id=0,
            )
        assert out.shape[1] == len(self.prompt) + self.new_tokens
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import mlx.core as mx
    from omni_qwen3_asr_mlx.blas import active_blas  # first: it picks MLX's BLAS before mlx loads

    with tempfile.TemporaryDirectory() as directory:
        checkpoint = make_checkpoint(directory)
        warm = clips(1, args.seconds)
        ours = OmniRunner(checkpoint, args.new_tokens)
        theirs = TransformersRunner(checkpoint, args.new_tokens, warm[0])
        ours(warm), theirs(warm)
        print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__} "
              f"({torch.get_num_threads()} threads), mlx {mx.__version__} ({mx.default_device()}, BLAS: {active_blas()})")
        print(f"# {args.seconds:g} s clips, {args.new_tokens} new tokens each, greedy, float32; "
              f"best of {args.repeats} alternating runs")
        print("| concurrency | omni MLX (audio s / s) | transformers generate (audio s / s) | ratio |")
        print("| --- | --- | --- | --- |")
        for concurrency in args.concurrency:
            audios = clips(concurrency, args.seconds)
            total = concurrency * args.seconds
            best_ours = best_theirs = float("inf")
            for _ in range(args.repeats):  # alternate, so both see the same machine load
                best_ours = min(best_ours, ours(audios))
                best_theirs = min(best_theirs, theirs(audios))
            rate_ours, rate_theirs = total / best_ours, total / best_theirs
            print(f"| {concurrency} | {rate_ours:.2f} | {rate_theirs:.2f} | {rate_ours / rate_theirs:.2f}x |", flush=True)
        ours.pipeline.shutdown()


if __name__ == "__main__":
    main()
