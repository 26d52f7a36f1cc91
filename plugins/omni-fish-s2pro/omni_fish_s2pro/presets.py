"""The ``tiny`` preset: S2-Pro's layout and architecture at tiny sizes with deterministic random
weights: config.json (model type ``fish_qwen3_omni``), model.safetensors under the official key
names (fused ``wqkv``, interleaved rotary rows), a byte-level tokenizer.json carrying S2-Pro's
special and semantic tokens, and codec.pth (weight-normed pairs, at the official strides: 2048
samples a frame). Its audio is noise: it exercises the runtime, not speech.

The ``full`` preset: the published sizes (fishaudio/s2-pro's config.json) and a tokenizer with the
published ids of the special and semantic tokens, its weights drawn at load on each stage's device
(``random_weights``): for serving and measuring speed at the real sizes on a GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

from .config import IM_END, IM_START, SEMANTIC_TOKEN, VOICE

MARKER = ".omni-preset"
PRESET = "tiny (revision 1)"
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|pad|>",
    IM_START,
    IM_END,
    "<|phoneme_start|>",
    "<|phoneme_end|>",
    "<|text|>",
    VOICE,
    "<|interleave|>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<|audio_pad|>",
]
CODEBOOK_SIZE = 64  # semantic tokens, and rows of each codebook of the ARs
NUM_CODEBOOKS = 10  # as the real model: the semantic code and nine residual ones
VOCAB_SIZE = 352  # the tokenizer's 332 and spare rows, as real checkpoints pad theirs
TEXT_CONFIG = dict(
    vocab_size=VOCAB_SIZE,
    n_layer=2,
    n_head=4,
    n_local_heads=2,
    head_dim=16,
    dim=64,
    intermediate_size=128,
    rope_base=1000000.0,
    norm_eps=1e-6,
    max_seq_len=4096,
    tie_word_embeddings=True,
    attention_qkv_bias=False,
    attention_o_bias=False,
    attention_qk_norm=True,
)
AUDIO_DECODER_CONFIG = dict(
    vocab_size=CODEBOOK_SIZE,
    num_codebooks=NUM_CODEBOOKS,
    n_layer=2,
    dim=64,
    n_head=4,
    n_local_heads=2,
    head_dim=16,
    intermediate_size=128,
    attention_qkv_bias=False,
    attention_o_bias=False,
    attention_qk_norm=False,
)
CODEC_SIZES = dict(
    encoder_dim=4,
    encoder_transformer_layers=(0, 0, 0, 1),
    latent_dim=64,
    decoder_dim=32,
    module_layers=2,
    module_hidden=128,
    semantic_codebook_size=CODEBOOK_SIZE,
    n_codebooks=NUM_CODEBOOKS - 1,
    codebook_size=32,
)


def tiny_tokenizer():
    """A byte-level BPE over the 256 byte symbols (no merges) with the special tokens and the
    semantic tokens after them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS + [SEMANTIC_TOKEN.format(i) for i in range(CODEBOOK_SIZE)])
    return tok


def _config(tok, text_config: dict = TEXT_CONFIG, audio_decoder_config: dict = AUDIO_DECODER_CONFIG) -> dict:
    return dict(
        model_type="fish_qwen3_omni",
        text_config=text_config,
        audio_decoder_config=audio_decoder_config,
        semantic_start_token_id=tok.token_to_id(SEMANTIC_TOKEN.format(0)),
        semantic_end_token_id=tok.token_to_id(SEMANTIC_TOKEN.format(audio_decoder_config["vocab_size"] - 1)),
        sample_rate=44100,
    )


def official_tensors(config: dict, seed: int = 0) -> dict:
    """Random weights for ``config`` under the official key names: normal(0, 0.02), norms at one."""
    import torch

    from .config import parse_config

    cfg = parse_config(config)
    gen = torch.Generator().manual_seed(seed)
    shapes: dict[str, tuple[int, ...]] = {}

    def layers(prefix: str, s) -> None:
        qkv = (s.n_head + 2 * s.n_local_heads) * s.head_dim
        for i in range(s.n_layer):
            p = f"{prefix}layers.{i}."
            shapes[p + "attention.wqkv.weight"] = (qkv, s.dim)
            if s.qkv_bias:
                shapes[p + "attention.wqkv.bias"] = (qkv,)
            shapes[p + "attention.wo.weight"] = (s.dim, s.n_head * s.head_dim)
            if s.qk_norm:
                shapes[p + "attention.q_norm.weight"] = shapes[p + "attention.k_norm.weight"] = (s.head_dim,)
            shapes[p + "attention_norm.weight"] = shapes[p + "ffn_norm.weight"] = (s.dim,)
            shapes[p + "feed_forward.w1.weight"] = shapes[p + "feed_forward.w3.weight"] = (
                s.intermediate_size,
                s.dim,
            )
            shapes[p + "feed_forward.w2.weight"] = (s.dim, s.intermediate_size)
        shapes[prefix + "norm.weight"] = (s.dim,)

    shapes["text_model.model.embeddings.weight"] = (cfg.vocab_size, cfg.slow.dim)
    layers("text_model.model.", cfg.slow)
    if not cfg.tie_word_embeddings:
        shapes["text_model.model.output.weight"] = (cfg.vocab_size, cfg.slow.dim)
    shapes["audio_decoder.codebook_embeddings.weight"] = (cfg.num_codebooks * cfg.codebook_size, cfg.slow.dim)
    shapes["audio_decoder.embeddings.weight"] = (cfg.codebook_size, cfg.fast.dim)
    layers("audio_decoder.", cfg.fast)
    shapes["audio_decoder.output.weight"] = (cfg.codebook_size, cfg.fast.dim)
    if cfg.fast.dim != cfg.slow.dim:
        shapes["audio_decoder.project_in.weight"] = (cfg.fast.dim, cfg.slow.dim)
        shapes["audio_decoder.project_in.bias"] = (cfg.fast.dim,)
    return {
        name: torch.ones(shape) if name.endswith("norm.weight") else torch.randn(shape, generator=gen) * 0.02
        for name, shape in shapes.items()
    }


def tiny_codec(seed: int = 0):
    import torch

    from .codec import Codec, CodecSizes

    torch.manual_seed(seed)
    return Codec(CodecSizes(**CODEC_SIZES)).eval()


def write_tiny(directory: str | Path, seed: int = 0) -> str:
    """Write the preset into ``directory`` (skipped when a finished copy is already there)."""
    import torch
    from safetensors.torch import save_file

    from .codec_checkpoint import FILE, official_state

    directory = Path(directory)
    marker = directory / MARKER
    if marker.exists() and marker.read_text() == PRESET:
        return str(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok = tiny_tokenizer()
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": IM_END,
                "pad_token": "<|pad|>",
                "clean_up_tokenization_spaces": False,
            },
            indent=2,
        )
    )
    config = _config(tok)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    save_file(
        {k: v.contiguous() for k, v in official_tensors(config, seed).items()},
        str(directory / "model.safetensors"),
    )
    torch.save(official_state(tiny_codec(seed)), str(directory / FILE))
    marker.write_text(PRESET)
    return str(directory)


FULL_PRESET = "full (revision 1)"
_FULL_SHARED = dict(
    dim=2560, n_head=32, n_local_heads=8, head_dim=128, intermediate_size=9728, rope_base=1000000.0, norm_eps=1e-6,
    attention_qkv_bias=False, attention_o_bias=False,
)  # fmt: skip
FULL_TEXT_CONFIG = dict(
    _FULL_SHARED,
    vocab_size=155776,
    n_layer=36,
    max_seq_len=32768,
    tie_word_embeddings=True,
    attention_qk_norm=True,
)
FULL_AUDIO_DECODER_CONFIG = dict(
    _FULL_SHARED, vocab_size=4096, num_codebooks=10, n_layer=4, attention_qk_norm=False, text_dim=2560
)
# the published ids: Qwen3's text tokens and its own specials (<|endoftext|> 151643, <|im_start|> 151644,
# <|im_end|> 151645 and 23 more up to 151668), then S2-Pro's from <|pad|> 151669 to <|audio_pad|> 151677,
# then the 4096 semantic tokens from 151678
FULL_REGULAR_TOKENS, FULL_QWEN_SPECIALS = 151643, 26


def full_tokenizer():
    """A byte-level BPE (no merges) whose ids are the published ones: filler words pad the regular
    vocabulary to Qwen3's size, so every id decodes to text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab.update(
        {f"\u0120w{i}": i for i in range(len(vocab), FULL_REGULAR_TOKENS)}
    )  # \u0120: the byte-level space
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    qwen = [SPECIAL_TOKENS[0], IM_START, IM_END] + [
        f"<|reserved_{i}|>" for i in range(FULL_QWEN_SPECIALS - 3)
    ]
    fish = [t for t in SPECIAL_TOKENS if t not in qwen]
    tok.add_special_tokens(qwen + fish + [SEMANTIC_TOKEN.format(i) for i in range(4096)])
    return tok


def write_random(
    directory: str | Path,
    name: str,
    text_config: dict,
    audio_decoder_config: dict,
    tok,
    codec_sizes: dict | None = None,
    std: float = 0.02,
    seed: int = 0,
) -> str:
    """A checkpoint of these sizes whose weights are drawn at load (``random_weights.json`` instead
    of model.safetensors and codec.pth; ``codec_sizes``: the official ones when None)."""
    from .random_weights import RANDOM_WEIGHTS

    directory = Path(directory)
    marker = directory / MARKER
    if marker.exists() and marker.read_text() == name:
        return str(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in [*directory.glob("*.safetensors*"), directory / "codec.pth"]:
        stale.unlink(missing_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": IM_END, "pad_token": "<|pad|>"}, indent=2
    ))  # fmt: skip
    config = _config(tok, text_config, audio_decoder_config)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    settings = {"std": std, "seed": seed, "codec": codec_sizes or {}}
    (directory / RANDOM_WEIGHTS).write_text(json.dumps(settings, indent=2))
    marker.write_text(name)
    return str(directory)


def write_full(directory: str | Path) -> str:
    return write_random(directory, FULL_PRESET, FULL_TEXT_CONFIG, FULL_AUDIO_DECODER_CONFIG, full_tokenizer())


def describe(directory: str | Path) -> str | None:
    marker = Path(directory) / MARKER
    return marker.read_text() if marker.exists() else None
