"""codec.pth: reading it into ``Codec`` and writing one in its layout (the tiny preset).

The file is a torch state dict (possibly under ``state_dict``, possibly with the training
wrapper's ``generator.`` prefix). Its causal convolutions are weight-normed, stored as
``<conv>.parametrizations.weight.original0`` (magnitude) and ``original1`` (direction); the
quantizers' projections in the older form, ``weight_g`` and ``weight_v``. Each pair folds into
one weight here. The transformers' fused ``wqkv`` rotate interleaved pairs: their q and k rows
are reordered for the core's rotary (``rotary_pairs``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from .codec import Codec, CodecSizes
from .codec_layers import CausalConv1d, CausalConvTranspose1d, WindowTransformer
from .random_weights import build_random, random_settings
from .rotary_pairs import fused_qkv_to_halves, fused_qkv_to_interleaved

FILE = "codec.pth"
log = logging.getLogger("omni.fish_s2pro")
_NEW_NORM = (".parametrizations.weight.original0", ".parametrizations.weight.original1")
_OLD_NORM = (".weight_g", ".weight_v")


def _fold(magnitude: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
    dims = tuple(range(1, direction.dim()))
    return magnitude * direction / direction.norm(dim=dims, keepdim=True)


def fold_weight_norm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in state.items():
        for g_suffix, v_suffix in (_NEW_NORM, _OLD_NORM):
            if name.endswith(g_suffix):
                base = name[: -len(g_suffix)]
                out[base + ".weight"] = _fold(tensor.float(), state[base + v_suffix].float())
                break
            if name.endswith(v_suffix):
                break
        else:
            out[name] = tensor
    return out


def read_state(path: str | Path) -> dict[str, torch.Tensor]:
    state = torch.load(str(path), map_location="cpu", weights_only=True)
    state = state.get("state_dict", state)
    if any(k.startswith("generator.") for k in state):
        state = {k[len("generator.") :]: v for k, v in state.items() if k.startswith("generator.")}
    return fold_weight_norm(state)


def _transformers(model: Codec):
    return [(name, m) for name, m in model.named_modules() if isinstance(m, WindowTransformer)]


def load_codec(
    checkpoint_dir: str | Path, device="cpu", dtype=torch.float32, sample_rate: int = 44100
) -> Codec:
    settings = random_settings(checkpoint_dir)
    if settings is not None:  # the sizes the file records (the official ones by default), weights drawn
        sizes = CodecSizes(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in settings.get("codec", {}).items()}
        )
        return build_random(lambda: Codec(sizes, sample_rate), device, dtype, settings)
    state = read_state(Path(checkpoint_dir) / FILE)
    model = Codec(CodecSizes.of_state(state), sample_rate)
    for prefix, transformer in _transformers(model):
        heads = transformer.layers[0].attention.heads if len(transformer.layers) else 0
        for i in range(len(transformer.layers)):
            key = f"{prefix}.layers.{i}.attention.wqkv.weight"
            state[key] = fused_qkv_to_halves(state[key], heads, heads, transformer.head_dim)
    expected = dict(model.state_dict())
    unexpected = sorted(set(state) - set(expected))
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ValueError(
            f"{FILE} does not match the codec: missing {missing[:8]}, unexpected {unexpected[:8]}"
        )
    if unexpected:  # training-only parts, which the reference's loader skips too (it loads non-strictly)
        log.warning(
            "%s: ignoring %d tensors the decoder and encoder do not use, e.g. %s",
            FILE,
            len(unexpected),
            unexpected[:4],
        )
    model.load_state_dict({k: state[k].to(v.dtype) for k, v in expected.items()})
    return model.to(device=device, dtype=dtype).eval()


def official_state(model: Codec) -> dict[str, torch.Tensor]:
    """``model``'s weights as codec.pth stores them: weight norm unfolded (magnitude and
    direction), interleaved rotary rows."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for prefix, transformer in _transformers(model):
        heads = transformer.layers[0].attention.heads if len(transformer.layers) else 0
        for i in range(len(transformer.layers)):
            key = f"{prefix}.layers.{i}.attention.wqkv.weight"
            state[key] = fused_qkv_to_interleaved(state[key], heads, heads, transformer.head_dim)
    for name, module in model.named_modules():
        if isinstance(module, (CausalConv1d, CausalConvTranspose1d)) and module.weight_norm:
            weight = state.pop(f"{name}.conv.weight")
            state[f"{name}.conv{_NEW_NORM[0]}"] = weight.norm(dim=tuple(range(1, weight.dim())), keepdim=True)
            state[f"{name}.conv{_NEW_NORM[1]}"] = weight
        elif name.endswith(("in_proj", "out_proj")):
            weight = state.pop(f"{name}.weight")
            state[f"{name}{_OLD_NORM[0]}"] = weight.norm(dim=tuple(range(1, weight.dim())), keepdim=True)
            state[f"{name}{_OLD_NORM[1]}"] = weight
    return state
