"""The ``tiny`` preset: Whisper's architecture at tiny sizes with deterministic random weights,
written in the Hugging Face layout (its transcripts are noise). The tokenizer is the bundled
tiny.en one, so the vocabulary keeps its real size."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import WhisperConfig

from omni_whisper.checkpoint import WhisperCheckpoint, bundled_model_dir, write_hf_checkpoint

TINY = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
            encoder_ffn_dim=128, decoder_ffn_dim=128)


def write_tiny(directory: str) -> str:
    """Materialise the preset into ``directory`` (idempotent) and return it."""
    out = Path(directory)
    if (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file():
        return str(out)
    from transformers import WhisperForConditionalGeneration

    config = WhisperConfig(vocab_size=51864, decoder_start_token_id=50257, pad_token_id=50256, bos_token_id=50256,
                           eos_token_id=50256, **TINY)
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    bundled = bundled_model_dir()
    checkpoint = WhisperCheckpoint(config=config, state_dict=state, tokenizer_dir=bundled)
    import json

    extra = json.loads((bundled / "config.json").read_text())
    checkpoint.suppress_ids = extra.get("suppress_ids", [])
    checkpoint.begin_suppress_ids = extra.get("suppress_ids_begin", [220, 50256])
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    write_hf_checkpoint(checkpoint, tmp)
    out.mkdir(parents=True, exist_ok=True)
    for item in tmp.iterdir():
        item.replace(out / item.name)
    tmp.rmdir()
    return str(out)
