"""CPU linear layers on weights pre-packed for oneDNN (``models.cpu_linear``): the logits head's
packed copy and the MLPs packed in place, against F.linear."""

import pytest
import torch
import torch.nn.functional as F
from omni_core.models.cpu_linear import PackedWeight, packing_supported

pytestmark = pytest.mark.skipif(not packing_supported(torch.zeros(2, 2)), reason="this torch has no oneDNN linear")


@pytest.mark.parametrize("rows", [1, 3, 20])
def test_packed_linear_matches_f_linear_and_follows_weight_changes(rows):
    torch.manual_seed(0)
    weight, x = torch.randn(300, 64), torch.randn(rows, 64)
    packed = PackedWeight()
    torch.testing.assert_close(packed.linear(x, weight), F.linear(x, weight), rtol=1e-5, atol=1e-4)
    with torch.no_grad():
        weight.mul_(-2.0)  # a weight loaded in place: the packed copy is made again
    torch.testing.assert_close(packed.linear(x, weight), F.linear(x, weight), rtol=1e-5, atol=1e-4)
    other = torch.randn(300, 64)
    torch.testing.assert_close(packed.linear(x, other), F.linear(x, other), rtol=1e-5, atol=1e-4)
    with torch.inference_mode():  # tensors made there carry no write counter
        made_there = torch.randn(300, 64)
        torch.testing.assert_close(packed.linear(x, made_there), F.linear(x, made_there), rtol=1e-5, atol=1e-4)


def test_only_float32_cpu_matrices_are_packed():
    assert not packing_supported(torch.zeros(4, 4, dtype=torch.bfloat16))
    assert not packing_supported(torch.zeros(4))
    assert not packing_supported(torch.zeros(4, 4, device="meta"))


def test_a_weight_given_new_storage_is_packed_again():
    torch.manual_seed(0)
    layer, x = torch.nn.Linear(64, 300, bias=False), torch.randn(4, 64)
    packed = PackedWeight()
    packed.linear(x, layer.weight)
    layer.weight.data = torch.randn(300, 64)  # same Parameter, new storage, no in-place write
    torch.testing.assert_close(packed.linear(x, layer.weight), F.linear(x, layer.weight), rtol=1e-5, atol=1e-4)


def _small_qwen(dtype=torch.float32):
    from types import SimpleNamespace

    from omni_core.models import Qwen2ForCausalLM, random_init

    config = SimpleNamespace(
        vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
    )
    return random_init(Qwen2ForCausalLM(config), seed=0).to(dtype).eval()


@pytest.mark.parametrize("rows", [1, 5, 600])  # 600: the MLP's row chunks run on the packed layers too
def test_packed_mlps_compute_what_the_weights_did_and_release_them(rows):
    from omni_core.models.cpu_linear import PackedCpuLinear, pack_mlp_weights

    model = _small_qwen()
    mlp = model.model.layers[0].mlp
    x = torch.randn(rows, 32)
    with torch.inference_mode():
        reference = mlp(x)
    assert pack_mlp_weights(model) == 2
    assert isinstance(mlp.gate_up_proj, PackedCpuLinear) and isinstance(mlp.down_proj, PackedCpuLinear)
    assert not any(".mlp." in name for name, _ in model.named_parameters())  # the unpacked weights are gone
    with torch.inference_mode():
        torch.testing.assert_close(mlp(x), reference, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(mlp(x.view(1, rows, 32)), reference.view(1, rows, 32), rtol=1e-5, atol=1e-5)
    assert pack_mlp_weights(model) == 0  # packed once


def test_bfloat16_mlps_stay_as_they_are():
    from omni_core.models.cpu_linear import pack_mlp_weights

    model = _small_qwen(torch.bfloat16)
    assert pack_mlp_weights(model) == 0
    assert isinstance(model.model.layers[0].mlp.down_proj, torch.nn.Linear)


def test_a_cpu_engine_packs_its_models_mlps():
    # what it then generates is checked against transformers in test_qwen_parity.py
    from omni_core.models.cpu_linear import PackedCpuLinear
    from omni_core.scheduler import AREngine, EngineConfig, SamplingParams

    model = _small_qwen()
    engine = AREngine(model, EngineConfig(block_size=16, num_kv_blocks=32), device="cpu")
    assert all(isinstance(layer.mlp.gate_up_proj, PackedCpuLinear) for layer in model.model.layers)
    out = engine.generate([[1, 2, 3, 4, 5]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].token_ids) == 4
