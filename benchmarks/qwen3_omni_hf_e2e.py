"""transformers' Qwen3-Omni end to end on one GPU at the real sizes: the chats that `omni bench
serve --chat-audio` sends to `omni serve --family qwen3-omni --preset full`, answered with text and
speech by ``generate(return_audio=True)`` (thinker, then talker with its code predictor, then
code2wav), for the side-by-side in docs/benchmarks.md.

The model is the `full` preset's config (Qwen3-Omni-30B-A3B's sizes) built on the GPU in bf16 with
random weights drawn in place, as omni's stages draw theirs. Both sides get the same prompts
through the same tokenizer and chat template, the same reply length (``--max-tokens``) and the
same cap on the talker's frames (``--talker-max-tokens``). transformers returns the audio when
generate ends: its first audio is its whole reply. Requests of a level run ``--batch`` at a time.

    python benchmarks/qwen3_omni_hf_e2e.py --dataset chat.jsonl --batches 1 --requests 2
    python benchmarks/qwen3_omni_hf_e2e.py --tiny --device cpu      # a dry run of the script
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def prompts(path: str | None, count: int) -> list[str]:
    """``count`` texts from the chat dataset omni bench reads (its built-in prompts without one)."""
    from omni_core.bench.dataset import BUILTIN_TEXTS, load_jsonl

    texts = [item.text for item in load_jsonl(path, "chat")] if path else list(BUILTIN_TEXTS)
    return [texts[i % len(texts)] for i in range(count)]


def build(directory: str, device: str):
    from omni_core.models.construct import constructing
    from omni_qwen3_omni.checkpoint import random_fill
    from omni_qwen3_omni.config import load_checkpoint, load_tokenizer, quiet_transformers
    from transformers import Qwen3OmniMoeForConditionalGeneration

    ckpt = load_checkpoint(directory)
    with quiet_transformers(), constructing(device, torch.bfloat16 if device == "cuda" else torch.float32):
        model = Qwen3OmniMoeForConditionalGeneration(ckpt.config).eval()
    random_fill(model)  # its init leaves the talker's experts empty; the same rule as omni's stages
    return model, load_tokenizer(directory), ckpt


@torch.no_grad()
def run(model, tokenizer, ckpt, texts: list[str], args) -> dict:
    tokenizer.padding_side = "left"
    chats = [[{"role": "user", "content": text}] for text in texts]
    rendered = [tokenizer.apply_chat_template(chat, chat_template=ckpt.chat_template, tokenize=False, add_generation_prompt=True)
                for chat in chats]
    batch = tokenizer(rendered, return_tensors="pt", padding=True).to(args.device)
    sync(args.device)
    start = time.perf_counter()
    text_ids, audio = model.generate(
        **batch, speaker=args.voice, return_audio=True, thinker_max_new_tokens=args.max_tokens, thinker_min_new_tokens=args.max_tokens,
        thinker_do_sample=True, talker_max_new_tokens=args.talker_max_tokens,
    )
    sync(args.device)
    wall = time.perf_counter() - start
    waves = [] if audio is None else list(audio) if isinstance(audio, (list, tuple)) else [audio]  # a list for several requests
    audio_s = sum(wave.numel() for wave in waves) / 24000
    return {"batch": len(texts), "wall_s": round(wall, 2), "audio_s": round(audio_s, 2),
            "reply_tokens": int(text_ids.shape[-1] - batch["input_ids"].shape[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default=None, help="JSONL with a text field per line (omni bench's chat dataset)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1])
    parser.add_argument("--requests", type=int, default=2, help="requests per batch size (after one warm-up)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--talker-max-tokens", type=int, default=150)
    parser.add_argument("--voice", default="Ethan")
    parser.add_argument("--json", default=None)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the tiny preset's sizes (a dry run)")
    args = parser.parse_args()

    from omni_qwen3_omni.presets import SIZES, VOCAB_SIZE, write_in_memory

    directory = tempfile.mkdtemp(prefix="qwen3-omni-random-")
    tiny = dict(parts=SIZES, vocab_size=VOCAB_SIZE, regular_tokens=0, name="tiny") if args.tiny else {}
    model, tokenizer, ckpt = build(write_in_memory(directory, **tiny), args.device)
    rows = []
    for size in args.batches:
        run(model, tokenizer, ckpt, prompts(args.dataset, size), args)  # warm-up
        for _ in range(max(1, args.requests // size)):
            row = run(model, tokenizer, ckpt, prompts(args.dataset, size), args)
            row["audio_s_per_s"] = round(row["audio_s"] / row["wall_s"], 3)
            row["rtf"] = round(row["wall_s"] / (row["audio_s"] / size), 3) if row["audio_s"] else None
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"system": "transformers", "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
