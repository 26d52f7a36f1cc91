"""The slow AR: S2-Pro's Qwen3-shaped decoder over text and semantic tokens, one step per frame.

The core's Qwen3 backbone runs it (the loader puts the interleaved rotary pairs in the halves
order, ``rotary_pairs``). What S2-Pro adds:

- at a semantic position (a frame of codes: prompt reference audio, or a frame generated
  earlier) the input is the token's embedding plus the embeddings of the frame's codes, one
  table of ``num_codebooks * codebook_size`` rows (codebook ``i`` at offset ``i * codebook_size``),
  all scaled by ``1 / sqrt(num_codebooks + 1)``;
- its logits are masked to the semantic tokens and the end token (``<|im_end|>``).
"""

from __future__ import annotations

import math

import torch
from omni_core.models import Qwen3ForCausalLM
from torch import nn

from .config import FishConfig, TokenIds


class SlowAR(Qwen3ForCausalLM):
    def __init__(self, cfg: FishConfig):
        self.qk_norm = cfg.slow.qk_norm
        super().__init__(cfg.slow_backbone_config())
        self.num_codebooks, self.codebook_size = cfg.num_codebooks, cfg.codebook_size
        self.codebook_embeddings = nn.Embedding(cfg.num_codebooks * cfg.codebook_size, cfg.slow.dim)
        self.register_buffer(
            "code_offsets", torch.arange(cfg.num_codebooks) * cfg.codebook_size, persistent=False
        )
        self.register_buffer("logit_bias", torch.zeros(cfg.vocab_size), persistent=False)
        self.frame_scale = 1.0 / math.sqrt(cfg.num_codebooks + 1)

    def allow_only(self, ids: TokenIds) -> None:
        """Logits of every token but the semantic ones and ``<|im_end|>`` become -inf."""
        self.logit_bias.fill_(float("-inf"))
        self.logit_bias[ids.semantic_begin : ids.semantic_end + 1] = 0
        self.logit_bias[ids.im_end] = 0

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return super().compute_logits(hidden) + self.logit_bias.to(hidden.dtype)

    def frame_embeds(self, token_embeds: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """The input rows of frames: ``token_embeds`` [n, H] (their semantic tokens' embeddings)
        and their codes [n, num_codebooks] -> [n, H]."""
        codes_sum = self.codebook_embeddings(codes + self.code_offsets).sum(dim=1)
        return (token_embeds + codes_sum.to(token_embeds.dtype)) * self.frame_scale

    @torch.inference_mode()
    def prompt_embeds(
        self, token_ids: torch.Tensor, codes: torch.Tensor, is_frame: torch.Tensor
    ) -> torch.Tensor:
        """A prompt's input rows: ``token_ids`` [L], ``codes`` [L, num_codebooks] (read where
        ``is_frame`` [L] is true) -> [L, H]."""
        embeds = self.embed(token_ids)
        rows = is_frame.nonzero().squeeze(1)
        if rows.numel():
            embeds[rows] = self.frame_embeds(embeds[rows], codes[rows])
        return embeds
