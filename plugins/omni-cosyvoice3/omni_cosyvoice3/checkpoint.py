"""Loading a Fun-CosyVoice3 checkpoint directory in its official layout and key names.

Layout: cosyvoice3.yaml, llm.pt, flow.pt, hift.pt, campplus.onnx, speech_tokenizer_v3.onnx,
CosyVoice-BlankEN/ (Qwen2 config + tokenizer) and optionally spk2info.pt. The llm's separate
q/k/v and gate/up projections are packed into the backbone's fused matmuls here.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from .config import CosyVoice3Config, load_config
from .flow import FlowModel
from .hift import HiftGenerator

REQUIRED_FILES = (
    "cosyvoice3.yaml",
    "llm.pt",
    "flow.pt",
    "hift.pt",
    "campplus.onnx",
    "speech_tokenizer_v3.onnx",
)
_PACKED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
_PACKED_KEY = re.compile(r"^(.*)\.(q_proj|k_proj|v_proj|gate_proj|up_proj)\.(weight|bias)$")


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded; the message names the file and the problem."""


def check_layout(directory: str | Path) -> Path:
    directory = Path(directory)
    missing = [f for f in REQUIRED_FILES if not (directory / f).exists()]
    if not (directory / "CosyVoice-BlankEN" / "config.json").exists():
        missing.append("CosyVoice-BlankEN/config.json")
    if missing:
        raise CheckpointError(f"{directory} is not a Fun-CosyVoice3 checkpoint: missing {missing}")
    return directory


def _state(path: Path) -> dict[str, torch.Tensor]:
    state = torch.load(path, map_location="cpu", weights_only=True)
    return state.get("state_dict", state) if isinstance(state, dict) else state


def _load_strict(module: torch.nn.Module, state: dict[str, torch.Tensor], name: str) -> None:
    result = module.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise CheckpointError(
            f"{name}: missing keys {result.missing_keys[:5]} ({len(result.missing_keys)}), "
            f"unexpected keys {result.unexpected_keys[:5]} ({len(result.unexpected_keys)})"
        )


def load_flow(directory: str | Path, cfg: CosyVoice3Config | None = None) -> FlowModel:
    directory = check_layout(directory)
    cfg = cfg or load_config(directory)
    model = FlowModel(cfg.flow)
    _load_strict(model, _state(directory / "flow.pt"), "flow.pt")
    model.decoder.estimator.fuse()
    return model.eval()


def load_hift(directory: str | Path, cfg: CosyVoice3Config | None = None) -> HiftGenerator:
    directory = check_layout(directory)
    cfg = cfg or load_config(directory)
    model = HiftGenerator(cfg.hift)
    _load_strict(model, _state(directory / "hift.pt"), "hift.pt")
    return model.eval()


def qwen_config(directory: str | Path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(Path(directory) / "CosyVoice-BlankEN"))


def load_llm(directory: str | Path, cfg: CosyVoice3Config | None = None):
    from .llm import CosyVoice3LM

    directory = check_layout(directory)
    cfg = cfg or load_config(directory)
    model = CosyVoice3LM(qwen_config(directory), cfg.llm)
    own = model.state_dict()
    filled: set[str] = set()
    with torch.no_grad():
        for key, value in _state(directory / "llm.pt").items():
            match = _PACKED_KEY.match(key)
            if match:
                prefix, part, kind = match.groups()
                packed_name, shard = _PACKED[part]
                target = f"{prefix}.{packed_name}.{kind}"
                layer = model.get_submodule(f"{prefix}.{packed_name}")
                start = layer.shard_offset(shard)
                own[target][start : start + value.shape[0]].copy_(value)
                filled.add(f"{target}#{shard}")
                continue
            if key == "llm.model.lm_head.weight" and key not in own:
                continue  # text head of a tied backbone: the speech LM never uses it
            if key not in own:
                raise CheckpointError(f"llm.pt: unexpected key {key}")
            if own[key].shape != value.shape:
                raise CheckpointError(
                    f"llm.pt: {key} has shape {tuple(value.shape)}, expected {tuple(own[key].shape)}"
                )
            own[key].copy_(value)
            filled.add(key)
    expected = set()
    for key in own:
        packed = re.match(r"^(.*)\.(qkv_proj|gate_up_proj)\.(weight|bias)$", key)
        if packed:
            shards = 3 if packed.group(2) == "qkv_proj" else 2
            expected.update(f"{key}#{i}" for i in range(shards))
        else:
            expected.add(key)
    missing = sorted(expected - filled)
    if missing:
        raise CheckpointError(f"llm.pt: missing keys {missing[:5]} ({len(missing)})")
    return model.eval()


def load_speakers(directory: str | Path) -> dict[str, dict]:
    """spk2info.pt: {speaker id: {"embedding": [1, 192], optional prompt tensors}}; {} when absent."""
    path = Path(directory) / "spk2info.pt"
    if not path.exists():
        return {}
    return torch.load(path, map_location="cpu", weights_only=True)
