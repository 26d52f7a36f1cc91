"""Text side of the frontend: normalisation and the Qwen tokenizer with CosyVoice3's special tokens.

CosyVoice-BlankEN/ holds a Qwen2 tokenizer; CosyVoice3 adds its own special tokens on top, in a
fixed order, so ``<|endofprompt|>`` gets id 151646 in the real vocabulary. The ``tiny`` preset
writes a small byte-level BPE trained here on a few sentences, with the same special tokens.

Normalisation is deliberately simple and language-neutral: trim, collapse whitespace, spell
out nothing. Text that carries ``<|...|>`` markup is passed through untouched.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ENDOFPROMPT = "<|endofprompt|>"
DEFAULT_SYSTEM = "You are a helpful assistant."
# added after the base vocabulary, in this order (ids continue from <|im_end|>); the phoneme
# markup tokens that follow them in CosyVoice3 are not supported as input here
SPECIAL_TOKENS = [
    "<|im_start|>",
    "<|im_end|>",
    ENDOFPROMPT,
    "[breath]",
    "<strong>",
    "</strong>",
    "[noise]",
    "[laughter]",
    "[cough]",
    "[clucking]",
    "[accent]",
    "[quick_breath]",
    "<laughter>",
    "</laughter>",
    "[hissing]",
    "[sigh]",
    "[vocalized-noise]",
    "[lipsmack]",
    "[mn]",
    "<|endofsystem|>",
]
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! This is a tiny text to speech model; its audio is noise.",
    "You are a helpful assistant. Please read the following sentence aloud.",
    "Numbers like 1, 2, 3 and 42 appear, as do questions? Yes: and answers.",
    "Streaming speech arrives in chunks, while the reference voice is cloned.",
]


def normalize_text(text: str) -> str:
    if "<|" in text and "|>" in text:
        return text
    return re.sub(r"\s+", " ", text).strip()


def write_tiny_tokenizer(directory: str | Path) -> int:
    """Train and save a small byte-level BPE as tokenizer.json; returns the vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    directory = Path(directory)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", *SPECIAL_TOKENS]
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer)
    tok.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 32768,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return tok.get_vocab_size()


class TextTokenizer:
    def __init__(self, directory: str | Path):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(directory))
        self.tokenizer.add_special_tokens(
            {
                "eos_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>",
                "additional_special_tokens": SPECIAL_TOKENS,
            }
        )
        self.endofprompt_id = self.tokenizer.convert_tokens_to_ids(ENDOFPROMPT)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def __len__(self) -> int:
        return len(self.tokenizer)
