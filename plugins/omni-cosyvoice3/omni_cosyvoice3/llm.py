"""The text-to-speech-token LM: a Qwen2 backbone with a speech-token embedding and output head.

It implements the engine's ARModel protocol (``embed``, ``forward(embeds, positions, ctx)``,
``compute_logits``): the prompt arrives as embeddings ([sos | text | task | prompt speech
tokens]); every generated token is a speech token fed back through ``speech_embedding``.
Names follow the official ``llm.pt``: ``llm.model.model.*`` (the backbone),
``llm.model.lm_head.weight`` (unused text head), ``speech_embedding.weight``,
``llm_decoder.weight``.
"""

from __future__ import annotations

import torch
from omni_core.models.logits_head import LogitsHead
from omni_core.models.qwen import Qwen2ForCausalLM
from torch import nn

from .config import LLMConfig

EXTRA_TOKEN_ROWS = 200  # speech_embedding / llm_decoder rows past the FSQ codebook (sos, eos, task, fill...)


class _Backbone(nn.Module):
    """Holds the Qwen2 LM under the attribute the official keys use (``llm.model``)."""

    def __init__(self, qwen_config):
        super().__init__()
        self.model = Qwen2ForCausalLM(qwen_config)


class CosyVoice3LM(nn.Module):
    def __init__(self, qwen_config, cfg: LLMConfig):
        super().__init__()
        self.cfg = cfg
        self.config = qwen_config  # the engine reads max_position_embeddings from it
        hidden = qwen_config.hidden_size
        rows = cfg.speech_token_size + EXTRA_TOKEN_ROWS
        self.llm = _Backbone(qwen_config)
        self.speech_embedding = nn.Embedding(rows, hidden)
        self.llm_decoder = nn.Linear(hidden, rows, bias=False)
        self._head = LogitsHead()
        self.kv_cache_spec = self.llm.model.kv_cache_spec
        self.supports_cuda_graphs = True

    @property
    def hidden_size(self) -> int:
        return self.speech_embedding.embedding_dim

    # -- ARModel protocol -------------------------------------------------------------------
    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Generated ids are speech tokens: they re-enter through the speech embedding."""
        return self.speech_embedding(token_ids)

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, ctx) -> torch.Tensor:
        return self.llm.model(embeds, positions, ctx)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._head(hidden, self.llm_decoder.weight)

    # -- prompt ---------------------------------------------------------------------------
    @torch.inference_mode()
    def prompt_embeds(self, text_ids: list[int], prompt_speech_tokens: list[int]) -> torch.Tensor:
        """[sos | text | task | prompt speech tokens] as embeddings [L, hidden]."""
        weight = self.speech_embedding.weight
        device = weight.device
        text = self.llm.model.embed(torch.tensor(text_ids, dtype=torch.long, device=device))
        sos = weight[self.cfg.sos][None]
        task = weight[self.cfg.task_id][None]
        speech = self.speech_embedding(torch.tensor(prompt_speech_tokens, dtype=torch.long, device=device))
        return torch.cat([sos, text.to(weight.dtype), task, speech], dim=0)

    def length_limits(self, text_len: int) -> tuple[int, int]:
        """(min, max) speech tokens for ``text_len`` text tokens to speak (prompt text excluded)."""
        return int(text_len * self.cfg.min_token_text_ratio), max(
            1, int(text_len * self.cfg.max_token_text_ratio)
        )
