"""Qwen3-Omni's talker (``talker.*``): the language model over codec codes that voices the
thinker's reply, and the projections that turn the thinker's states into its inputs.

The decoder is the core's Qwen3-MoE (per-head q/k norms, routed experts plus a shared expert with
a sigmoid gate, multimodal rotary positions) over the codec vocabulary: ``codec_embedding`` and
``codec_head`` in the checkpoint are its token embedding and logits head. ``text_projection``
(the thinker's input embeddings) and ``hidden_projection`` (its ``accept_hidden_layer`` states at
media positions) are two-layer MLPs from the thinker's width to the talker's.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from omni_core.models import Qwen3MoeForCausalLM
from torch import nn

# checkpoint names (under ``talker.``) -> the core backbone's
RENAMES = {"model.codec_embedding.weight": "model.embed_tokens.weight", "codec_head.weight": "lm_head.weight"}


class TalkerLM(Qwen3MoeForCausalLM):
    """``talker.model.*`` and ``talker.codec_head`` (loaded through ``checkpoint_weights``).
    ``suppress(ids)``: logits of those codec ids are -inf (in the decode graphs too)."""

    def __init__(self, config):
        super().__init__(config)
        self.register_buffer("logit_bias", torch.zeros(config.vocab_size), persistent=False)

    def suppress(self, ids: list[int]) -> None:
        self.logit_bias.zero_()
        self.logit_bias[torch.tensor(ids, dtype=torch.long, device=self.logit_bias.device)] = float("-inf")

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return super().compute_logits(hidden) + self.logit_bias.to(hidden.dtype)


class ResizeMLP(nn.Module):
    """``linear_fc2(act(linear_fc1(x)))`` from the thinker's width to the talker's."""

    def __init__(self, thinker_hidden: int, intermediate: int, hidden: int, act: str = "silu"):
        super().__init__()
        if act != "silu":
            raise ValueError(f"talker projection activation {act!r} is not supported (silu)")
        self.linear_fc1 = nn.Linear(thinker_hidden, intermediate)
        self.linear_fc2 = nn.Linear(intermediate, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class TalkerProjections(nn.Module):
    """``talker.text_projection`` and ``talker.hidden_projection``."""

    def __init__(self, config):
        super().__init__()
        text = config.text_config
        self.text_projection = ResizeMLP(config.thinker_hidden_size, text.intermediate_size, text.hidden_size, text.hidden_act)
        self.hidden_projection = ResizeMLP(config.thinker_hidden_size, text.intermediate_size, text.hidden_size, text.hidden_act)


def checkpoint_weights(weights: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """The talker decoder's tensors of ``talker.model.*`` / ``talker.codec_head`` under the backbone's names."""
    for name, tensor in weights:
        name = name.removeprefix("talker.")
        yield RENAMES.get(name, name), tensor
