"""CPU linear layers on pre-packed weights (``models.cpu_linear``): the logits head's copy packed
for oneDNN, and the decoder layers' projections packed in place for oneDNN or the host kernel
(``native/linear.c``), against F.linear."""

import contextlib

import pytest
import torch
import torch.nn.functional as F
from omni_core.models import native
from omni_core.models.cpu_linear import PackedWeight, packing_supported
from omni_core.models.native import linear as host_linear

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


@contextlib.contextmanager
def _intra_op_threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(native.load("linear") is None, reason="no C compiler on this machine")
@pytest.mark.parametrize(("rows", "in_features", "out_features", "bias"), [(1, 64, 32, False), (7, 48, 100, True), (13, 256, 384, True), (64, 1024, 33, False)])
def test_host_kernel_matches_f_linear(rows, in_features, out_features, bias):
    """Blocks of 6, 2 and 1 rows; a last panel of fewer than 32 columns; with and without bias."""
    g = torch.Generator().manual_seed(rows)
    weight, x = torch.randn(out_features, in_features, generator=g), torch.randn(rows, in_features, generator=g)
    b = torch.randn(out_features, generator=g) if bias else None
    got = host_linear.linear(x, host_linear.pack(weight), b, out_features)
    torch.testing.assert_close(got, F.linear(x, weight, b), rtol=1e-5, atol=1e-4)
    with pytest.raises(TypeError, match="float32"):
        host_linear.linear(x.bfloat16(), host_linear.pack(weight), b, out_features)


@pytest.mark.skipif(native.load("linear") is None, reason="no C compiler on this machine")
@pytest.mark.parametrize("rows", [1, 5, 600])  # 600: the MLP's row chunks run on the packed layers too
def test_packed_layers_compute_what_the_weights_did_and_release_them(rows):
    """gate/up for oneDNN; down_proj, q/k/v and o_proj for the host kernel (taken here whatever it measures)."""
    from omni_core.models.cpu_linear import HostLinear, PackedCpuLinear, pack_cpu_linears

    model = _small_qwen()
    layer = model.model.layers[0]
    mlp, attn = layer.mlp, layer.self_attn
    x = torch.randn(rows, 32)
    layers = {"mlp": mlp, "qkv": attn.qkv_proj, "o": attn.o_proj}
    with torch.inference_mode():
        reference = {name: f(x) for name, f in layers.items()}
    assert pack_cpu_linears(model, host_kernel=True) == 8  # two layers: gate/up, down, q/k/v, o_proj each
    assert isinstance(mlp.gate_up_proj, PackedCpuLinear) and isinstance(mlp.down_proj, HostLinear)
    assert isinstance(attn.qkv_proj, HostLinear) and isinstance(attn.o_proj, HostLinear)
    assert not any(".mlp." in name or "_proj.weight" in name for name, _ in model.named_parameters())  # the unpacked weights are gone
    layers = {"mlp": mlp, "qkv": attn.qkv_proj, "o": attn.o_proj}
    with torch.inference_mode():
        for name, f in layers.items():
            torch.testing.assert_close(f(x), reference[name], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(f(x.view(1, rows, 32)), reference[name].view(1, rows, -1), rtol=1e-5, atol=1e-5)
    assert pack_cpu_linears(model) == 0  # packed once


def _packed_without_the_host_kernel(model) -> bool:
    from omni_core.models.cpu_linear import PackedCpuLinear

    return all(
        isinstance(layer.mlp.gate_up_proj, PackedCpuLinear) and isinstance(layer.mlp.down_proj, PackedCpuLinear) and type(layer.self_attn.o_proj) is torch.nn.Linear
        for layer in model.model.layers
    )


def test_with_many_threads_or_switched_off_only_the_mlps_are_packed_for_onednn(monkeypatch):
    from omni_core.models.cpu_linear import HOST_LINEAR_ENV, pack_cpu_linears

    model = _small_qwen()
    with _intra_op_threads(native.MAX_INTRA_OP_THREADS + 1):  # torch's matmuls use them all, the kernel one
        assert pack_cpu_linears(model) == 4
    assert _packed_without_the_host_kernel(model)
    model = _small_qwen()
    assert pack_cpu_linears(model, host_kernel=False) == 4
    assert _packed_without_the_host_kernel(model)
    model = _small_qwen()
    monkeypatch.setenv(HOST_LINEAR_ENV, "0")
    assert pack_cpu_linears(model) == 4
    assert _packed_without_the_host_kernel(model)


@pytest.mark.skipif(native.load("linear") is None, reason="no C compiler on this machine")
def test_by_default_each_shape_is_timed_once_and_either_choice_computes_the_same():
    """Which side wins depends on the CPU; one measurement per layer shape decides for every layer
    of that shape, and the packed model computes what the unpacked one did."""
    from omni_core.models import cpu_linear

    model = _small_qwen()
    x = torch.randn(6, 32)
    with torch.inference_mode():
        reference = [layer.mlp(x) for layer in model.model.layers]
    timed = []
    original = cpu_linear._host_kernel_faster
    with _intra_op_threads(1):
        cpu_linear._host_kernel_faster = lambda lin, alternative: timed.append((lin.in_features, lin.out_features)) or original(lin, alternative)
        try:
            cpu_linear.pack_cpu_linears(model)
        finally:
            cpu_linear._host_kernel_faster = original
    assert sorted(timed) == [(32, 32), (32, 64), (48, 32)]  # o_proj, q/k/v, down_proj: once each for both layers
    kinds = {type(layer.mlp.down_proj) for layer in model.model.layers}
    assert len(kinds) == 1
    with torch.inference_mode():
        for layer, expected in zip(model.model.layers, reference, strict=True):
            torch.testing.assert_close(layer.mlp(x), expected, rtol=1e-5, atol=1e-5)


def test_bfloat16_layers_stay_as_they_are():
    from omni_core.models.cpu_linear import pack_cpu_linears

    model = _small_qwen(torch.bfloat16)
    assert pack_cpu_linears(model) == 0
    assert type(model.model.layers[0].mlp.down_proj) is torch.nn.Linear
    assert isinstance(model.model.layers[0].self_attn.qkv_proj, torch.nn.Linear)


def test_a_cpu_engine_packs_its_models_projections():
    # what it then generates is checked against transformers in test_qwen_parity.py
    from omni_core.models.cpu_linear import PackedCpuLinear
    from omni_core.scheduler import AREngine, EngineConfig, SamplingParams

    model = _small_qwen()
    engine = AREngine(model, EngineConfig(block_size=16, num_kv_blocks=32), device="cpu")
    assert all(isinstance(layer.mlp.gate_up_proj, PackedCpuLinear) for layer in model.model.layers)
    out = engine.generate([[1, 2, 3, 4, 5]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].token_ids) == 4
