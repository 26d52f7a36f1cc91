"""The ``tiny`` and ``tiny-multilingual`` presets: Whisper's architecture at tiny sizes with
deterministic random weights, written in the Hugging Face layout (their transcripts are noise).

``tiny`` takes the bundled tiny.en tokenizer, so its vocabulary keeps its real size (51864,
English-only). ``tiny-multilingual`` has the multilingual layout (51865: ``<|endoftext|>`` at
50257, ``<|startoftranscript|>`` 50258, the 99 language tokens from 50259, ``<|translate|>``
50358, ``<|transcribe|>`` 50359 ...): the same tokenizer with one more text token before
``<|endoftext|>``, so every special token sits one id later. It exercises language detection
and translation without multilingual weights."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import torch
from transformers import WhisperConfig

from omni_whisper.checkpoint import (
    MULTILINGUAL_VOCAB,
    WhisperCheckpoint,
    bundled_model_dir,
    write_hf_checkpoint,
)

TINY = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
            encoder_ffn_dim=128, decoder_ffn_dim=128)
EXTRA_TEXT_TOKEN = "Ġ" * 48  # the text token that shifts the specials; BPE merges never produce it
ENGLISH_EOT = 50256


def multilingual_id(token_id: int) -> int:
    """Where an English-only id sits in the multilingual layout: specials one later."""
    return token_id + (token_id >= ENGLISH_EOT)


def multilingual_tokenizer(english: dict) -> dict:
    """An English-only ``tokenizer.json`` laid out as a multilingual one (module docstring)."""
    out = copy.deepcopy(english)
    vocab = out["model"]["vocab"]
    if EXTRA_TEXT_TOKEN in vocab or vocab["<|endoftext|>"] != ENGLISH_EOT:
        raise ValueError("not an English-only Whisper tokenizer")
    out["model"]["vocab"] = {piece: multilingual_id(i) for piece, i in vocab.items()} | {EXTRA_TEXT_TOKEN: ENGLISH_EOT}
    for token in out["added_tokens"]:
        token["id"] = multilingual_id(token["id"])
    for special in (out.get("post_processor") or {}).get("special_tokens", {}).values():
        special["ids"] = [multilingual_id(i) for i in special["ids"]]
    return out


MARKER = ".omni-preset"  # names the preset: its weights are random (build warns once)


def preset_name(directory: str) -> str | None:
    """The preset a checkpoint directory holds, or None for a real checkpoint."""
    marker = Path(directory) / MARKER
    return marker.read_text() if marker.is_file() else None


def _write(directory: str, multilingual: bool) -> str:
    out = Path(directory)
    if (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file() and (out / MARKER).is_file():
        return str(out)
    from transformers import WhisperForConditionalGeneration

    bundled = bundled_model_dir()
    extra = json.loads((bundled / "config.json").read_text())
    suppress, begin_suppress = extra.get("suppress_ids", []), extra.get("suppress_ids_begin", [220, ENGLISH_EOT])
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if multilingual:
        english = json.loads((bundled / "tokenizer.json").read_text())
        (tmp / "tokenizer.json").write_text(json.dumps(multilingual_tokenizer(english), ensure_ascii=False))
        suppress, begin_suppress = [multilingual_id(i) for i in suppress], [multilingual_id(i) for i in begin_suppress]
        ids = dict(vocab_size=MULTILINGUAL_VOCAB, decoder_start_token_id=50258, pad_token_id=50257, bos_token_id=50257,
                   eos_token_id=50257)
    else:
        ids = dict(vocab_size=51864, decoder_start_token_id=50257, pad_token_id=50256, bos_token_id=50256, eos_token_id=50256)
    config = WhisperConfig(**ids, **TINY)
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    checkpoint = WhisperCheckpoint(config=config, state_dict=state, tokenizer_dir=tmp if multilingual else bundled,
                                   suppress_ids=suppress, begin_suppress_ids=begin_suppress)
    write_hf_checkpoint(checkpoint, tmp)
    (tmp / MARKER).write_text("tiny-multilingual" if multilingual else "tiny")
    out.mkdir(parents=True, exist_ok=True)
    for item in tmp.iterdir():
        item.replace(out / item.name)
    tmp.rmdir()
    return str(out)


def write_tiny(directory: str) -> str:
    """Materialise the English-only preset into ``directory`` (idempotent) and return it."""
    return _write(directory, multilingual=False)


def write_tiny_multilingual(directory: str) -> str:
    """Materialise the multilingual preset into ``directory`` (idempotent) and return it."""
    return _write(directory, multilingual=True)
