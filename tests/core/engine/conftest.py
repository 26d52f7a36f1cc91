"""A tiny random transformers Qwen2 checkpoint shared by the engine tests."""

import pytest

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
