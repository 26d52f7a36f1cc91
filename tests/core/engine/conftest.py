"""A tiny random transformers Qwen2 checkpoint shared by the engine tests."""

import pytest
import torch

from tests.helpers.hf_models import one_torch_thread, save_hf_models  # noqa: F401 - autouse fixture

VOCAB = 128


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """(transformers model, checkpoint dir) of a 2-layer Qwen2 with peaked random weights."""
    root = tmp_path_factory.mktemp("tiny")
    return save_hf_models(root, {"qwen2": {"arch": "Qwen2ForCausalLM", "vocab_size": VOCAB}})["qwen2"]


@pytest.fixture(scope="session")
def tiny_model(tiny_checkpoint):
    """Our Qwen2 backbone with the checkpoint's weights (shared; engines only read it)."""
    from omni_core.models import load_causal_lm

    return load_causal_lm(tiny_checkpoint[1])


class ShiftedLM(torch.nn.Module):
    """``base`` with each request's ``extras["shift"]`` added to its input embeddings: a model
    that reads per-request state from its extras (as a family keeps per-request encoder state)."""

    def __init__(self, base):
        super().__init__()
        self.base = base
        self.kv_cache_spec, self.hidden_size = base.kv_cache_spec, base.hidden_size

    def embed(self, ids):
        return self.base.embed(ids)

    def forward(self, embeds, positions, ctx):
        shift = torch.cat([ex["shift"].expand(n, -1) for ex, n in zip(ctx.extras, ctx.query_lens, strict=True)])
        return self.base(embeds + shift, positions, ctx)

    def compute_logits(self, hidden):
        return self.base.compute_logits(hidden)
