"""Tiny random transformers decoders (saved with save_pretrained) for the engine and model tests."""

import pytest
import torch
import transformers

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)

ARCHS = {
    "Qwen2ForCausalLM": ("Qwen2Config", {}),
    "Qwen3ForCausalLM": ("Qwen3Config", {"head_dim": 16}),
    "Qwen3MoeForCausalLM": ("Qwen3MoeConfig", {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True}),
    "Qwen2MoeForCausalLM": ("Qwen2MoeConfig", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48}),
}


def make_hf_model(arch: str, seed: int = 0, **overrides):
    config_name, extra = ARCHS[arch]
    config = getattr(transformers, config_name)(**{**TINY, **extra, **overrides})
    torch.manual_seed(seed)
    # larger-than-default weights give peaked logits, so greedy parity is not decided by ties
    model = getattr(transformers, arch)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.normal_(0, 0.08)
    return model


def save_hf_models(root, models: dict[str, dict]) -> dict:
    """name -> (transformers model, checkpoint dir) for ``{name: dict(arch=..., **overrides)}``,
    built on one intra-op thread."""
    out = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, spec in models.items():
            spec = dict(spec)
            model = make_hf_model(spec.pop("arch"), **spec)
            path = root / name
            model.save_pretrained(path)
            out[name] = (model, path)
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models on a shared 2-core machine: one intra-op thread avoids spin-wait contention."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
