"""The checkpoint's tokenizer, checked for the control tokens the ASR prompt needs."""

from __future__ import annotations

from transformers import AutoTokenizer

REQUIRED_TOKENS = ("<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>", "<asr_text>")
END_TOKENS = ("<|im_end|>", "<|endoftext|>")


def load_tokenizer(checkpoint_dir: str):
    tokenizer = AutoTokenizer.from_pretrained(checkpoint_dir)
    vocab = tokenizer.get_vocab()
    missing = [t for t in REQUIRED_TOKENS if t not in vocab]
    if missing:
        raise ValueError(f"the tokenizer in {checkpoint_dir} lacks the Qwen3-ASR tokens {missing}")
    return tokenizer


def end_token_ids(tokenizer, config_eos: tuple[int, ...]) -> set[int]:
    vocab = tokenizer.get_vocab()
    ids = {vocab[t] for t in END_TOKENS if t in vocab}
    return ids | {i for i in config_eos if i < len(vocab)}
