"""The thinker's language model on the core AR engine: Qwen3-MoE (per-head q/k norms, routed
experts) with multimodal rotary positions (``omni_core.models.layers.RotaryEmbedding``), whose
prompt rows at media placeholders are the encoders' outputs and whose first layers add the
vision encoder's deepstack features at visual rows.

A request's media travel in its engine ``extras["media"]`` (``PromptMedia``): the encoder rows
and, per prompt position, which row (if any) replaces the placeholder's embedding. They are
applied in prefill steps only (chunked or not, and again when a preempted request is
recomputed); decode steps are the plain backbone, so they run in the engine's decode graphs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from omni_core.models import Qwen3MoeForCausalLM
from omni_core.models.attention import ForwardContext


@dataclass
class PromptMedia:
    """``index[i]``: the row of ``rows`` that prompt position ``i`` takes (-1: its token's
    embedding); ``deep_index[i]``: its row of ``deep`` ([layers, V, H], added after layer k)."""

    rows: torch.Tensor  # [M, H]
    index: torch.Tensor  # [L] int64, on the host
    deep: torch.Tensor | None = None  # [layers, V, H]
    deep_index: torch.Tensor | None = None  # [L] int64, on the host

    def to(self, device, dtype) -> PromptMedia:
        deep = None if self.deep is None else self.deep.to(device, dtype)
        return PromptMedia(self.rows.to(device, dtype), self.index, deep, self.deep_index)


class ThinkerLM(Qwen3MoeForCausalLM):
    """``thinker.model.*`` and ``thinker.lm_head`` of the checkpoint (loaded without the prefix)."""

    @staticmethod
    def reads_extras_in_prefill(extras: list[dict]) -> bool:
        """A prefill with media inserts their rows on the host (no prefill graph for it)."""
        return any("media" in e for e in extras)

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        if not (ctx.is_prefill and self.reads_extras_in_prefill(ctx.extras)):
            return super().forward(embeds, positions, ctx)
        embeds, layer_inputs = self._insert_media(embeds, ctx)
        return self.model(embeds, positions, ctx, layer_inputs)

    @staticmethod
    def _insert_media(embeds: torch.Tensor, ctx: ForwardContext):
        embeds = embeds.clone()
        deep_rows: list[torch.Tensor] = []
        deep_values: list[torch.Tensor] = []
        offset = 0
        for b, (extras, n) in enumerate(zip(ctx.extras, ctx.query_lens, strict=True)):
            media: PromptMedia | None = extras.get("media")
            if media is not None:
                start = ctx.meta.host_context_lens[b] - n  # this step's tokens are positions start..start+n
                take = media.index[start : start + n]
                rows = (take >= 0).nonzero().squeeze(1)
                if rows.numel():
                    embeds[(rows + offset).to(embeds.device)] = media.rows[take[rows].to(media.rows.device)].to(embeds.dtype)
                if media.deep is not None:
                    take = media.deep_index[start : start + n]
                    rows = (take >= 0).nonzero().squeeze(1)
                    if rows.numel():
                        deep_rows.append((rows + offset).to(embeds.device))
                        deep_values.append(media.deep[:, take[rows].to(media.deep.device)])
            offset += n
        if not deep_rows:
            return embeds, None
        rows = torch.cat(deep_rows)
        values = torch.cat(deep_values, dim=1)
        return embeds, {layer: (rows, values[layer]) for layer in range(values.shape[0])}
