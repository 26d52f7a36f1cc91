"""config.json of an S2-Pro checkpoint (model type ``fish_qwen3_omni``) and the token ids the
runtime needs from its tokenizer.

``text_config`` sizes the slow AR, ``audio_decoder_config`` the fast AR (its missing sizes fall
back to the slow AR's, as the reference's loader does). The semantic token range is read from the
tokenizer (``<|semantic:0|>`` .. ``<|semantic:4095|>``), which the reference also trusts over
config.json.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

MODEL_TYPE = "fish_qwen3_omni"
SAMPLE_RATE = 44100
SEMANTIC_TOKEN = "<|semantic:{}|>"
IM_START, IM_END, VOICE = "<|im_start|>", "<|im_end|>", "<|voice|>"


@dataclass(frozen=True)
class TransformerSizes:
    """One of the two ARs, in the checkpoint's own vocabulary of sizes."""

    n_layer: int
    dim: int
    n_head: int
    n_local_heads: int
    head_dim: int
    intermediate_size: int
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool


@dataclass(frozen=True)
class FishConfig:
    slow: TransformerSizes
    fast: TransformerSizes
    vocab_size: int
    codebook_size: int  # rows per codebook in both ARs' code embeddings
    num_codebooks: int  # codes per frame: the semantic code and the residual ones
    rope_base: float
    norm_eps: float
    max_seq_len: int
    tie_word_embeddings: bool
    sample_rate: int

    def slow_backbone_config(self) -> SimpleNamespace:
        """The slow AR in the attribute names of the core's Qwen3 backbone."""
        s = self.slow
        return SimpleNamespace(
            vocab_size=self.vocab_size,
            hidden_size=s.dim,
            intermediate_size=s.intermediate_size,
            num_hidden_layers=s.n_layer,
            num_attention_heads=s.n_head,
            num_key_value_heads=s.n_local_heads,
            head_dim=s.head_dim,
            rms_norm_eps=self.norm_eps,
            max_position_embeddings=self.max_seq_len,
            rope_theta=self.rope_base,
            tie_word_embeddings=self.tie_word_embeddings,
            attention_bias=s.qkv_bias,
        )


def _default_ffn(dim: int) -> int:
    """The reference's FFN width where a config leaves it out: 8/3 of the width, up to a multiple of 256."""
    return -(-int(8 * dim / 3) // 256) * 256


def _sizes(raw: dict, fallback: TransformerSizes | None = None) -> TransformerSizes:
    def get(key: str, default):
        value = raw.get(key)
        return default if value is None else value

    fb = fallback
    n_head = int(get("n_head", fb.n_head if fb else 32))
    dim = int(get("dim", fb.dim if fb else 4096))
    local = int(get("n_local_heads", fb.n_local_heads if fb else -1))
    return TransformerSizes(
        n_layer=int(raw["n_layer"]),
        dim=dim,
        n_head=n_head,
        n_local_heads=n_head if local == -1 else local,
        head_dim=int(
            get("head_dim", fb.head_dim if fb else 64)
        ),  # the reference's default, not dim // n_head
        intermediate_size=int(get("intermediate_size", fb.intermediate_size if fb else _default_ffn(dim))),
        qkv_bias=bool(get("attention_qkv_bias", fb.qkv_bias if fb else False)),
        o_bias=bool(get("attention_o_bias", fb.o_bias if fb else False)),
        qk_norm=bool(get("attention_qk_norm", fb.qk_norm if fb else False)),
    )


def parse_config(raw: dict) -> FishConfig:
    if raw.get("model_type") != MODEL_TYPE:
        raise ValueError(
            f"config.json: model_type {raw.get('model_type')!r} is not {MODEL_TYPE!r} (Fish Audio S2-Pro)"
        )
    text, audio = raw["text_config"], raw["audio_decoder_config"]
    slow = _sizes(text)
    fast = _sizes(audio, slow)
    for name, sizes in (("text_config", slow), ("audio_decoder_config", fast)):
        if sizes.o_bias:
            raise NotImplementedError(f"config.json: {name}.attention_o_bias is not supported")
    return FishConfig(
        slow=slow,
        fast=fast,
        vocab_size=int(text["vocab_size"]),
        codebook_size=int(audio["vocab_size"]),
        num_codebooks=int(audio["num_codebooks"]),
        rope_base=float(text.get("rope_base", 10000)),
        norm_eps=float(text.get("norm_eps", 1e-5)),
        max_seq_len=int(text.get("max_seq_len", 2048)),
        tie_word_embeddings=bool(text.get("tie_word_embeddings", True)),
        sample_rate=int(raw.get("sample_rate", SAMPLE_RATE)),
    )


@functools.lru_cache(maxsize=8)
def load_config(checkpoint_dir: str) -> FishConfig:
    return parse_config(json.loads((Path(checkpoint_dir) / "config.json").read_text()))


@dataclass(frozen=True)
class TokenIds:
    semantic_begin: int  # the id of <|semantic:0|>
    semantic_end: int  # the id of the last semantic token
    im_start: int
    im_end: int
    voice: int
    turn_end: tuple[int, ...] = ()  # ``<|im_end|>\n``, which closes a turn


@functools.lru_cache(maxsize=8)
def load_tokenizer(checkpoint_dir: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(checkpoint_dir) / "tokenizer.json"))


def token_ids(checkpoint_dir: str, codebook_size: int) -> TokenIds:
    """The ids of the special tokens the prompt and the sampler use. The semantic tokens must be
    contiguous: a code ``c`` is the token ``semantic_begin + c``."""
    tok = load_tokenizer(checkpoint_dir)

    def find(token: str) -> int:
        found = tok.token_to_id(token)
        if found is None:
            raise ValueError(f"{checkpoint_dir}: the tokenizer has no {token!r}")
        return found

    begin = find(SEMANTIC_TOKEN.format(0))
    end = find(SEMANTIC_TOKEN.format(codebook_size - 1))
    if (
        end - begin != codebook_size - 1
        or tok.token_to_id(SEMANTIC_TOKEN.format(codebook_size // 2)) != begin + codebook_size // 2
    ):
        raise ValueError(f"{checkpoint_dir}: the semantic tokens are not contiguous ids")
    return TokenIds(
        semantic_begin=begin,
        semantic_end=end,
        im_start=find(IM_START),
        im_end=find(IM_END),
        voice=find(VOICE),
        turn_end=tuple(tok.encode(f"{IM_END}\n", add_special_tokens=False).ids),
    )
