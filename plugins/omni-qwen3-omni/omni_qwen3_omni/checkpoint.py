"""Loading each stage's part of a Qwen3-Omni checkpoint (official key names, sharded safetensors):
a stage reads only the shards that hold its prefix. A checkpoint with random weights in memory
(the ``full`` preset) has its weights drawn on the stage's device instead."""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from omni_core.hooks import warn_random_weights
from omni_core.models import iter_safetensors, load_weights
from omni_core.models.construct import constructing
from omni_core.platforms import platform_for

from .audio_encoder import AudioEncoder
from .code2wav import Code2Wav
from .code_predictor import CodePredictor
from .config import RANDOM_WEIGHTS, CheckpointError, OmniCheckpoint
from .presets import describe
from .talker import TalkerLM, TalkerProjections, checkpoint_weights
from .thinker import ThinkerLM
from .vision_encoder import VisionEncoder

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: str) -> torch.dtype:
    if name == "auto":
        return getattr(torch, platform_for(device).default_dtype)  # bfloat16 on CUDA and XPU, float32 on CPU
    if name not in DTYPES:
        raise ValueError(f"qwen3-omni: dtype must be auto or one of {sorted(DTYPES)}, not {name!r}")
    return DTYPES[name]


def check_layout(checkpoint_dir: str) -> None:
    root = Path(checkpoint_dir)
    missing = [name for name in ("config.json",) if not (root / name).exists()]
    if not list(root.glob("*.safetensors")) and not (root / RANDOM_WEIGHTS).exists():
        missing.append("*.safetensors")
    if missing:
        raise CheckpointError(f"{root} is not a Qwen3-Omni checkpoint: missing {', '.join(missing)}")
    preset = describe(root)
    if preset:
        warn_random_weights("qwen3-omni", str(root), preset, "speech and text")


def build_thinker(ckpt: OmniCheckpoint, device: str, dtype: torch.dtype) -> ThinkerLM:
    with constructing(device, dtype):
        return ThinkerLM(ckpt.text_config).eval()


Renaming = Callable[[Iterator[tuple[str, torch.Tensor]]], Iterator[tuple[str, torch.Tensor]]]


def _fill(model: torch.nn.Module, ckpt: OmniCheckpoint, prefixes: tuple[str, ...], strip_prefix: str = "",
          rename: Renaming | None = None) -> None:
    """The checkpoint's tensors under ``prefixes`` into ``model``, or random ones drawn in place."""
    if ckpt.random_weights_std is not None:
        random_fill(model, strip_prefix, ckpt.random_weights_std)
        return
    weights = itertools.chain.from_iterable(iter_safetensors(ckpt.path, prefix) for prefix in prefixes)
    load_weights(model, rename(weights) if rename else weights, strip_prefix=strip_prefix)


@torch.no_grad()
def random_fill(model: torch.nn.Module, namespace: str = "", std: float = 0.02) -> torch.nn.Module:
    """Random weights drawn on the parameters' own device: normal(0, ``std``) matrices, each from a
    seed of its name under ``namespace`` (a table two stages hold, the thinker's embeddings, is the
    same in both); of the vectors, norm weights 1, layer scales 0.01, biases and Snake's log-scale
    parameters 0."""
    for name, param in model.named_parameters():
        if param.dim() > 1:
            generator = torch.Generator(param.device).manual_seed(zlib.crc32((namespace + name).encode()))
            param.normal_(0.0, std, generator=generator)
        elif name.endswith("scale") or name.endswith("gamma"):
            param.fill_(0.01)
        elif name.endswith("weight"):
            param.fill_(1.0)
        else:
            param.zero_()
    return model


def load_thinker(ckpt: OmniCheckpoint, device: str, dtype: torch.dtype) -> ThinkerLM:
    model = build_thinker(ckpt, device, dtype)
    _fill(model, ckpt, ("thinker.model.", "thinker.lm_head."), strip_prefix="thinker.")
    return model.eval()


def load_audio_encoder(ckpt: OmniCheckpoint, device: str, dtype: torch.dtype) -> AudioEncoder:
    with constructing(device, dtype):
        model = AudioEncoder(ckpt.audio_config)
    _fill(model, ckpt, ("thinker.audio_tower.",), strip_prefix="thinker.audio_tower.")
    return model.eval()


def load_vision_encoder(ckpt: OmniCheckpoint, device: str, dtype: torch.dtype) -> VisionEncoder:
    with constructing(device, dtype):
        model = VisionEncoder(ckpt.vision_config)
    _fill(model, ckpt, ("thinker.visual.",), strip_prefix="thinker.visual.")
    return model.eval()


def load_talker(ckpt: OmniCheckpoint, device: str, dtype: torch.dtype) -> tuple[TalkerLM, TalkerProjections]:
    config = ckpt.speech_config("talker_config")
    with constructing(device, dtype):
        model, projections = TalkerLM(config.text_config).eval(), TalkerProjections(config).eval()
    _fill(model, ckpt, ("talker.model.", "talker.codec_head."), rename=checkpoint_weights)
    _fill(projections, ckpt, ("talker.text_projection.", "talker.hidden_projection."), strip_prefix="talker.")
    return model, projections


def load_code_predictor(ckpt: OmniCheckpoint, device: str, dtype: torch.dtype) -> CodePredictor:
    config = ckpt.speech_config("talker_config").code_predictor_config
    with constructing(device, dtype):
        model = CodePredictor(config).eval()
    _fill(model, ckpt, ("talker.code_predictor.",), strip_prefix="talker.code_predictor.")
    return model


def load_code2wav(ckpt: OmniCheckpoint, device: str, dtype: torch.dtype) -> Code2Wav:
    with constructing(device, dtype):
        model = Code2Wav(ckpt.speech_config("code2wav_config")).eval()
    _fill(model, ckpt, ("code2wav.",), strip_prefix="code2wav.")
    return model


def load_thinker_embedding(ckpt: OmniCheckpoint, device: str, dtype: torch.dtype) -> torch.nn.Embedding:
    """The thinker's token embedding table alone: the talker stage projects the reply's ids itself,
    so the thinker sends ids, not embeddings."""
    text = ckpt.text_config
    with constructing(device, dtype):
        table = torch.nn.Embedding(text.vocab_size, text.hidden_size)
    _fill(table, ckpt, ("thinker.model.embed_tokens.",), strip_prefix="thinker.model.embed_tokens.")
    return table.eval()
