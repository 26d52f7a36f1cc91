"""The ``tiny`` preset: the real Qwen3-ASR architecture at tiny sizes with deterministic random
weights, written in the transformers checkpoint layout (config.json, model.safetensors,
preprocessor_config.json, a byte-level tokenizer with the Qwen3-ASR control tokens).
Its transcripts are random tokens: it exercises the runtime, not recognition."""

from __future__ import annotations

import os
import shutil
import tempfile

SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>",
    "<|audio_pad|>", "<asr_text>",
]
READY_MARK = ".omni-preset-complete"


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", clean_up_tokenization_spaces=False
    )


def tiny_config(vocab_size: int, audio_token_id: int, eos_ids: list[int], **sizes):
    from transformers import Qwen3ASRConfig

    hidden = sizes.get("hidden_size", 64)
    return Qwen3ASRConfig(
        audio_config=dict(
            num_mel_bins=128,
            encoder_layers=sizes.get("encoder_layers", 2),
            encoder_attention_heads=4,
            encoder_ffn_dim=sizes.get("encoder_ffn_dim", 128),
            d_model=sizes.get("d_model", 64),
            output_dim=hidden,
            downsample_hidden_size=sizes.get("conv_channels", 16),
        ),
        text_config=dict(
            vocab_size=vocab_size,
            hidden_size=hidden,
            intermediate_size=sizes.get("intermediate_size", 128),
            num_hidden_layers=sizes.get("decoder_layers", 2),
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=hidden // 4,
            initializer_range=0.3,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        ),
        audio_token_id=audio_token_id,
        eos_token_id=eos_ids,
        pad_token_id=eos_ids[0],
    )


def write_tiny(target: str, seed: int = 0, **sizes) -> str:
    """Write a tiny random checkpoint to ``target`` (created if needed) and return it."""
    import torch
    from transformers import Qwen3ASRFeatureExtractor, Qwen3ASRForConditionalGeneration

    tokenizer = tiny_tokenizer()
    vocab = tokenizer.get_vocab()
    config = tiny_config(
        len(vocab), vocab["<|audio_pad|>"], [vocab["<|im_end|>"], vocab["<|endoftext|>"]], **sizes
    )
    torch.manual_seed(seed)
    model = Qwen3ASRForConditionalGeneration(config).eval()
    os.makedirs(target, exist_ok=True)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    Qwen3ASRFeatureExtractor().save_pretrained(target)
    open(os.path.join(target, READY_MARK), "w").close()
    return target


def tiny_preset(directory: str | None = None) -> str:
    """Materialise the ``tiny`` preset (idempotent): returns the checkpoint directory."""
    directory = directory or os.path.join(tempfile.gettempdir(), "omni-presets", "qwen3-asr-tiny")
    if os.path.exists(os.path.join(directory, READY_MARK)):
        return directory
    parent = os.path.dirname(os.path.abspath(directory))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".qwen3-asr-tiny-", dir=parent)
    write_tiny(staging)
    if os.path.isdir(directory) and not os.listdir(directory):
        os.rmdir(directory)
    try:
        os.replace(staging, directory)  # atomic: concurrent callers never see half a checkpoint
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not os.path.exists(os.path.join(directory, READY_MARK)):
            raise
    return directory
