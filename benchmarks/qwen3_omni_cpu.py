"""Qwen3-Omni's thinker on CPU: output tokens/s of omni's pipeline (preprocess, audio encoder,
thinker on the AR engine) against transformers' batched ``generate`` of the thinker, for N
concurrent mixed requests, side by side in one run.

Model: a small random Qwen3-Omni in the official layout (thinker text 256 wide, 4 layers, 8 query /
2 KV heads of 32, 32 experts top-4 of width 128, vocab 2048; audio encoder 128 wide, 2 layers; the
tiny preset's vision encoder), float32, one intra-op thread. Requests (fixed seed): half text only
(a 20-200 character question), half 5-20 s of audio (noise) plus "Transcribe the audio"; greedy,
output lengths drawn from [16, 128]. omni: all N submitted at once through ``Omni`` (continuous
batching; each request stops at its own length or its end token). transformers: the same prompts,
features and lengths in one left-padded batch (thinker ``generate``, features padded with their
mask); it runs to the longest, and only each row's tokens up to its own length or end token count.
Runs alternate, each repeat with new requests (none in the prefix cache); the median of
``--repeats`` is shown.

    python benchmarks/qwen3_omni_cpu.py --concurrency 1 8 32 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np
import torch

SIZES = {
    "text_config": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                        num_experts=128, num_experts_per_tok=8, moe_intermediate_size=64, vocab_size=2048, initializer_range=0.05,
                        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [6, 5, 5], "interleaved": True}),
    "audio_config": dict(d_model=128, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=256, downsample_hidden_size=32,
                         output_dim=256, n_window_infer=800),
    "vision_config": dict(out_hidden_size=256),
}


def requests(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        tokens = int(rng.integers(16, 129))
        if i % 2:
            seconds = float(rng.uniform(5, 20))
            audio = (rng.standard_normal(int(seconds * 16000)) * 0.1).astype(np.float32)
            content = [{"type": "audio", "audio": audio, "sample_rate": 16000}, {"type": "text", "text": "Transcribe the audio"}]
        else:  # random letters: no two prompts share a prefix the cache could reuse
            content = "".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz  "), int(rng.integers(20, 200))))
            audio = None
        out.append({"messages": [{"role": "user", "content": content}], "max_tokens": tokens, "audio": audio})
    return out


def run_omni(omni, batch: list[dict]) -> tuple[float, int]:
    start = time.perf_counter()
    handles = [omni.submit(omni.chat_inputs(r["messages"], sampling={"temperature": 0, "max_tokens": r["max_tokens"]})) for r in batch]
    tokens = 0
    for handle in handles:
        for event in handle:
            if event.end and event.name == "text":
                tokens += event.payload["usage"]["completion_tokens"]
    return time.perf_counter() - start, tokens


def hf_batch(omni, batch: list[dict]):
    """The thinker's inputs for the batch, left-padded, from omni's own preprocessing."""
    from omni_core.models.mel import log_mel
    from omni_core.scheduler.executor import Message
    from omni_qwen3_omni.config import load_checkpoint
    from omni_qwen3_omni.stages import Preprocessor

    ckpt = load_checkpoint(omni.checkpoint_dir)
    pre = Preprocessor(ckpt, dict(max_audios=8, max_images=8, max_videos=2, video_fps=2.0, video_max_frames=8,
                                  video_min_pixels=3136, video_max_pixels=16384, max_model_len=32768))
    prompts, clips = [], []
    for r in batch:
        out = {}
        pre(Message("r", "in", omni.chat_inputs(r["messages"])), lambda port, payload, end=True, out=out: out.__setitem__(port, payload))
        prompts.append(out["prompt"]["token_ids"])
        clips += out.get("audio", {}).get("clips", [])
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), 1
    kwargs = {"input_ids": ids, "attention_mask": mask}
    if clips:
        mels = [log_mel(c, ckpt.audio.n_mels) for c in clips]
        frames = max(m.shape[1] for m in mels)
        features = torch.zeros(len(mels), ckpt.audio.n_mels, frames)
        fmask = torch.zeros(len(mels), frames, dtype=torch.long)
        for i, m in enumerate(mels):
            features[i, :, : m.shape[1]], fmask[i, : m.shape[1]] = m, 1
        kwargs.update(input_features=features, feature_attention_mask=fmask)
    return kwargs, ckpt.tokens.eos


def run_hf(model, kwargs, eos, batch: list[dict]) -> tuple[float, int]:
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(**kwargs, max_new_tokens=max(r["max_tokens"] for r in batch), do_sample=False, eos_token_id=list(eos), pad_token_id=0)
    elapsed = time.perf_counter() - start
    new = out[:, kwargs["input_ids"].shape[1] :].tolist()
    tokens = 0
    for row, r in zip(new, batch, strict=True):
        row = row[: r["max_tokens"]]
        stop = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        tokens += stop
    return elapsed, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from omni_core import Omni
    from omni_qwen3_omni.presets import write_tiny
    from transformers import Qwen3OmniMoeForConditionalGeneration

    path = write_tiny(tempfile.mkdtemp(prefix="qwen3-omni-bench-"), sizes=SIZES)
    hf = Qwen3OmniMoeForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval().thinker
    with Omni(family="qwen3-omni", checkpoint_dir=path, options={"max_batch": 32, "max_model_len": 4096}) as omni:
        run_omni(omni, requests(2, seed=99))  # warm-up
        print("| concurrent | output tokens (omni / transformers) | omni tok/s | transformers tok/s | ratio |")
        print("| --- | --- | --- | --- | --- |")
        for n in args.concurrency:
            ours, theirs = [], []
            for repeat in range(args.repeats):  # new requests each repeat: the prefix cache holds none of them
                batch = requests(n, seed=repeat)
                kwargs, eos = hf_batch(omni, batch)
                seconds, tokens_ours = run_omni(omni, batch)
                ours.append(tokens_ours / seconds)
                seconds, tokens_hf = run_hf(hf, kwargs, eos, batch)
                theirs.append(tokens_hf / seconds)
            a, b = statistics.median(ours), statistics.median(theirs)
            print(f"| {n} | {tokens_ours} / {tokens_hf} | {a:.1f} | {b:.1f} | {a / b:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
