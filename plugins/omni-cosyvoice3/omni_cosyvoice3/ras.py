"""Repetition-aware sampling (RAS) for a whole batch in a few tensor ops.

Per row: nucleus sampling (top-p over at most top-k candidates); if the drawn token already
occurs in the last ``win_size`` generated tokens at least ``win_size * tau_r`` times, it is
banned and the token is drawn again from the full distribution. Rows still under their minimum
length cannot draw the ids the caller blocks: by default the first id past the speech codebook
(6561) alone, as the reference's sampling does, so the other ids past the codebook stay drawable
and end a request, as there (CosyVoice3's trained end token, 6562, among them). Randomness comes in as
two uniforms per row, so a per-request seed decides a request's draws whatever else is batched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RasParams:
    """Per-row settings, each a tensor of shape [B] on the logits' device."""

    top_p: torch.Tensor
    top_k: torch.Tensor  # int64
    temperature: torch.Tensor
    k_max: int  # the largest top_k of the batch, known on the host (no device sync)
    win_size: int = 10
    tau_r: float = 0.1


def _draw(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw of one index per row from unnormalised non-negative ``weights`` [B, N]."""
    cdf = weights.cumsum(dim=-1)
    target = (u * cdf[:, -1]).unsqueeze(-1)
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return idx.clamp(max=weights.shape[-1] - 1)


def ras_sample(
    logits: torch.Tensor,
    history: torch.Tensor,
    params: RasParams,
    uniforms: torch.Tensor,
    under_min: torch.Tensor,
    blocked: torch.Tensor,
) -> torch.Tensor:
    """logits [B, V]; history [B, W] recent tokens (-1 = none); uniforms [B, 2] in [0, 1);
    under_min [B] bool: rows under their minimum length, which cannot draw the ids ``blocked``
    ([V] bool). Returns token ids [B] (int64)."""
    scores = logits.float() / params.temperature.clamp(min=1e-5)[:, None]
    vocab = scores.shape[-1]
    scores = scores.masked_fill(under_min[:, None] & blocked[None, :], float("-inf"))
    probs = scores.softmax(dim=-1)

    k_max = int(min(vocab, params.k_max))
    top_p, top_i = probs.topk(k_max, dim=-1)  # sorted, descending
    rank = torch.arange(k_max, device=probs.device)[None, :]
    before = top_p.cumsum(dim=-1) - top_p
    keep = (before < params.top_p[:, None]) & (rank < params.top_k[:, None])
    keep[:, 0] = True
    first = top_i.gather(1, _draw(top_p * keep, uniforms[:, 0])[:, None]).squeeze(1)

    repeats = (history == first[:, None]).sum(dim=-1)
    repeated = repeats >= params.win_size * params.tau_r
    banned = probs.scatter(1, first[:, None], 0.0)
    second = _draw(banned, uniforms[:, 1])
    return torch.where(repeated, second, first)
