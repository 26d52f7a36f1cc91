"""The CPU logits head on a weight pre-packed for oneDNN (``models.cpu_linear``) against F.linear."""

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
