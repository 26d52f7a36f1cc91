"""A tiny random transformers Qwen2 checkpoint shared by the engine tests."""

import pytest
import torch
import transformers

VOCAB = 128


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """(transformers model, checkpoint dir) of a 2-layer Qwen2 with peaked random weights."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        config = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
        torch.manual_seed(0)
        model = transformers.Qwen2ForCausalLM(config).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if not name.endswith("norm.weight"):
                    p.normal_(0, 0.08)
        path = tmp_path_factory.mktemp("tiny") / "qwen2"
        model.save_pretrained(path)
    finally:
        torch.set_num_threads(threads)
    return model, path


@pytest.fixture(scope="session")
def tiny_model(tiny_checkpoint):
    """Our Qwen2 backbone with the checkpoint's weights (shared; engines only read it)."""
    from omni_core.models import load_causal_lm

    return load_causal_lm(tiny_checkpoint[1])


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny models on a shared 2-core machine: one intra-op thread avoids spin-wait contention."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
