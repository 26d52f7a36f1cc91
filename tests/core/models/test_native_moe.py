"""The host experts kernel (``native/moe.c``) against the torch path, and engines packing their
MoE layers for it."""

import pytest
import torch
from omni_core.models.moe import SparseMoeBlock
from omni_core.models.native import moe as host_moe

pytestmark = pytest.mark.skipif(not host_moe.preferred(), reason="the host experts kernel does not build here")


def _block(hidden=64, experts=16, top_k=4, inter=40, seed=0):
    torch.manual_seed(seed)
    block = SparseMoeBlock(hidden, experts, top_k, inter, norm_topk_prob=True)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.1)
    return block


@pytest.mark.parametrize("tokens", [1, 2, 7, 32, 300])
@pytest.mark.parametrize(("hidden", "inter"), [(64, 40), (48, 96)])  # widths that are not whole panels of 32
def test_host_kernel_equals_the_torch_path(tokens, hidden, inter):
    block = _block(hidden=hidden, inter=inter)
    x = torch.randn(tokens, hidden)
    with torch.inference_mode():
        expected = block(x)
        block.experts.pack_for_host()
        got = block(x)
    assert block.experts.gate_up_proj.numel() == 0  # the weights live in the panels only
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_engine_packs_moe_layers():
    import transformers
    from omni_core.models import random_causal_lm
    from omni_core.models.moe import Experts
    from omni_core.scheduler import AREngine, EngineConfig, SamplingParams

    config = transformers.Qwen3MoeConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=8, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24,
                                         max_position_embeddings=256)
    config.architectures = ["Qwen3MoeForCausalLM"]
    model = random_causal_lm(config)
    experts = [m for m in model.modules() if isinstance(m, Experts)]
    engine = AREngine(model, EngineConfig(num_kv_blocks=64, block_size=8))
    assert all(m.host_packed is not None for m in experts)
    out = engine.generate([[1, 2, 3], [4, 5, 6, 7]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert [len(o.token_ids) for o in out] == [8, 8]  # tokens equal transformers': test_qwen_parity (Qwen3MoeForCausalLM)


def test_bad_expert_ids_are_refused_not_read():
    block = _block()
    block.experts.pack_for_host()
    ids = torch.tensor([[0, 16]])  # 16 experts: id 16 is past the last
    with pytest.raises(ValueError, match="expert ids"):
        block.experts(torch.randn(1, 64), ids, torch.ones(1, 2))
