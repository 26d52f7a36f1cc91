"""Whisper checkpoints: Hugging Face directories (openai/whisper-* layout) and CTranslate2 ``model.bin``.

Both load into one form: a ``WhisperConfig`` plus a state dict with Hugging Face key names
(``model.encoder.layers.0.self_attn.q_proj.weight`` ...). CTranslate2 fuses projections; they
split back without loss: self-attention ``linear_0`` is q|k|v (k has no bias, its slice of the
fused bias is zero), cross-attention ``linear_0`` is q and ``linear_1`` is k|v, the output
projection is tied to the token embedding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import WhisperConfig

from omni_whisper.bundled import bundled_model_dir
from omni_whisper.ct2 import CT2FormatError, read_ct2_model

BUNDLED_ID = "bundled:tiny.en"

# Whisper's multilingual vocabulary has 51865 entries; the English-only one has 51864.
MULTILINGUAL_VOCAB = 51865


class CheckpointError(ValueError):
    """A directory that is not a Whisper checkpoint this plugin can load."""


@dataclass
class WhisperCheckpoint:
    config: WhisperConfig
    state_dict: dict[str, torch.Tensor]
    tokenizer_dir: Path
    suppress_ids: list[int] = field(default_factory=list)
    begin_suppress_ids: list[int] = field(default_factory=lambda: [220, 50256])
    alignment_heads: list[list[int]] = field(default_factory=list)


def resolve_checkpoint_dir(checkpoint: str | None) -> Path:
    """A local directory for ``checkpoint``: the bundled id, a path, or a Hugging Face repo id."""
    if checkpoint in (None, "", BUNDLED_ID, "tiny.en"):
        return bundled_model_dir()
    path = Path(checkpoint).expanduser()
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(checkpoint))


def is_ct2_dir(path: Path) -> bool:
    """A CTranslate2 model: ``model.bin`` without a Hugging Face ``config.json`` (one with ``model_type``)."""
    if not (path / "model.bin").is_file():
        return False
    config = path / "config.json"
    return not config.is_file() or "model_type" not in json.loads(config.read_text())


def load_checkpoint(path: str | Path, weights: bool = True) -> WhisperCheckpoint:
    """The checkpoint at ``path``; with ``weights=False`` its configuration, tokenizer directory
    and decoding lists only (``state_dict`` empty): no weight is read."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a directory")
    if is_ct2_dir(path):
        return _load_ct2(path, weights)
    if (path / "config.json").is_file():
        return _load_hf(path, weights)
    raise CheckpointError(f"{path} holds neither a Hugging Face Whisper checkpoint nor a CTranslate2 model.bin")


# -- Hugging Face layout ---------------------------------------------------------------------------


def _load_hf(path: Path, weights: bool) -> WhisperCheckpoint:
    config = WhisperConfig.from_pretrained(path)
    if config.model_type != "whisper":
        raise CheckpointError(f"{path}: model_type is {config.model_type!r}, expected 'whisper'")
    checkpoint = WhisperCheckpoint(config=config, state_dict=_hf_state(path) if weights else {}, tokenizer_dir=path)
    generation = path / "generation_config.json"
    if generation.is_file():
        gen = json.loads(generation.read_text())
        checkpoint.suppress_ids = list(gen.get("suppress_tokens") or [])
        checkpoint.begin_suppress_ids = list(gen.get("begin_suppress_tokens") or [220, config.eos_token_id])
        checkpoint.alignment_heads = list(gen.get("alignment_heads") or [])
    return checkpoint


def _hf_state(path: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    shards = sorted(path.glob("*.safetensors"))
    if shards:
        from safetensors.torch import load_file

        for shard in shards:
            state.update(load_file(shard))
    elif (path / "pytorch_model.bin").is_file():
        state = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise CheckpointError(f"{path}: no *.safetensors or pytorch_model.bin")
    return {k if k.startswith("model.") or k == "proj_out.weight" else f"model.{k}": v for k, v in state.items()}


# -- CTranslate2 layout ----------------------------------------------------------------------------


def _ct2_to_hf_state(ct2, layers_enc: int, layers_dec: int) -> dict[str, torch.Tensor]:
    def t(name: str) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(ct2[name]))

    state: dict[str, torch.Tensor] = {}

    def norm(dst: str, src: str) -> None:
        state[f"{dst}.weight"], state[f"{dst}.bias"] = t(f"{src}/gamma"), t(f"{src}/beta")

    def linear(dst: str, src: str) -> None:
        state[f"{dst}.weight"], state[f"{dst}.bias"] = t(f"{src}/weight"), t(f"{src}/bias")

    def split_qkv(dst: str, src: str, names: tuple[str, ...]) -> None:
        weights = t(f"{src}/weight").chunk(len(names), dim=0)
        biases = t(f"{src}/bias").chunk(len(names), dim=0)
        for name, weight, bias in zip(names, weights, biases, strict=True):
            state[f"{dst}.{name}.weight"] = weight.clone()
            if name != "k_proj":  # Whisper's key projection has no bias (CTranslate2 stores zeros)
                state[f"{dst}.{name}.bias"] = bias.clone()

    for side, count in (("encoder", layers_enc), ("decoder", layers_dec)):
        hf = f"model.{side}"
        for i in range(count):
            src, dst = f"{side}/layer_{i}", f"{hf}.layers.{i}"
            norm(f"{dst}.self_attn_layer_norm", f"{src}/self_attention/layer_norm")
            split_qkv(f"{dst}.self_attn", f"{src}/self_attention/linear_0", ("q_proj", "k_proj", "v_proj"))
            linear(f"{dst}.self_attn.out_proj", f"{src}/self_attention/linear_1")
            if side == "decoder":
                norm(f"{dst}.encoder_attn_layer_norm", f"{src}/attention/layer_norm")
                linear(f"{dst}.encoder_attn.q_proj", f"{src}/attention/linear_0")
                split_qkv(f"{dst}.encoder_attn", f"{src}/attention/linear_1", ("k_proj", "v_proj"))
                linear(f"{dst}.encoder_attn.out_proj", f"{src}/attention/linear_2")
            norm(f"{dst}.final_layer_norm", f"{src}/ffn/layer_norm")
            linear(f"{dst}.fc1", f"{src}/ffn/linear_0")
            linear(f"{dst}.fc2", f"{src}/ffn/linear_1")
        norm(f"{hf}.layer_norm", f"{side}/layer_norm")
        state[f"{hf}.embed_positions.weight"] = t(f"{side}/position_encodings/encodings")
    for conv in ("conv1", "conv2"):
        linear(f"model.encoder.{conv}", f"encoder/{conv}")
    state["model.decoder.embed_tokens.weight"] = t("decoder/embeddings/weight")
    return state


def _count_layers(names, side: str) -> int:
    parts = (n.split("/") for n in names if n.startswith(f"{side}/layer_"))
    return len({p[1] for p in parts if p[1].removeprefix("layer_").isdigit()})


def _load_ct2(path: Path, weights: bool) -> WhisperCheckpoint:
    try:
        ct2 = read_ct2_model(path / "model.bin", data=weights)
    except CT2FormatError as exc:
        raise CheckpointError(str(exc)) from None
    if ct2.spec and ct2.spec != "WhisperSpec":
        raise CheckpointError(f"{path}/model.bin is a {ct2.spec}, not a WhisperSpec")
    names = list(ct2.variables)
    layers_enc, layers_dec = _count_layers(names, "encoder"), _count_layers(names, "decoder")
    vocab, d_model = ct2["decoder/embeddings/weight"].shape
    config = WhisperConfig(
        vocab_size=int(vocab),
        num_mel_bins=int(ct2["encoder/conv1/weight"].shape[1]),
        d_model=int(d_model),
        encoder_layers=layers_enc,
        decoder_layers=layers_dec,
        encoder_attention_heads=int(ct2.scalar("encoder/num_heads")),
        decoder_attention_heads=int(ct2.scalar("decoder/num_heads")),
        encoder_ffn_dim=int(ct2["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        decoder_ffn_dim=int(ct2["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
        max_source_positions=int(ct2["encoder/position_encodings/encodings"].shape[0]),
        max_target_positions=int(ct2["decoder/position_encodings/encodings"].shape[0]),
        decoder_start_token_id=50258 if vocab >= MULTILINGUAL_VOCAB else 50257,
        pad_token_id=50256,
        bos_token_id=50256,
        eos_token_id=50256,
        tie_word_embeddings=True,
        torch_dtype="float16",
    )
    state = _ct2_to_hf_state(ct2, layers_enc, layers_dec) if weights else {}
    extra = json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
    return WhisperCheckpoint(
        config=config,
        state_dict=state,
        tokenizer_dir=path,
        suppress_ids=list(extra.get("suppress_ids") or []),
        begin_suppress_ids=list(extra.get("suppress_ids_begin") or [220, 50256]),
        alignment_heads=list(extra.get("alignment_heads") or []),
    )


def write_hf_checkpoint(checkpoint: WhisperCheckpoint, out_dir: str | Path, dtype=torch.float32) -> Path:
    """Save ``checkpoint`` in the Hugging Face layout (config, generation config, safetensors, tokenizer)."""
    import shutil

    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = checkpoint.config
    config.save_pretrained(out)
    state = {k: v.to(dtype).contiguous() for k, v in checkpoint.state_dict.items() if k != "proj_out.weight"}
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    tokenizer = checkpoint.tokenizer_dir / "tokenizer.json"
    if tokenizer.is_file() and tokenizer.resolve() != (out / "tokenizer.json").resolve():
        shutil.copyfile(tokenizer, out / "tokenizer.json")
    english_only = config.vocab_size < MULTILINGUAL_VOCAB
    generation = {
        "decoder_start_token_id": config.decoder_start_token_id,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
        "max_length": config.max_target_positions,
        "suppress_tokens": checkpoint.suppress_ids,
        "begin_suppress_tokens": checkpoint.begin_suppress_ids,
        "alignment_heads": checkpoint.alignment_heads,
        "no_timestamps_token_id": 50362 if english_only else 50363,
        "is_multilingual": not english_only,
        "max_initial_timestamp_index": 50,
    }
    if not english_only and (out / "tokenizer.json").is_file():  # what transformers detects and translates with
        from omni_whisper.tokenizer import WhisperTokenizer

        tokenizer = WhisperTokenizer(out, config.vocab_size)
        generation["lang_to_id"] = {f"<|{code}|>": token_id for code, token_id in sorted(tokenizer.languages.items(), key=lambda item: item[1])}
        generation["task_to_id"] = {"transcribe": tokenizer.transcribe, "translate": tokenizer.translate}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return out
