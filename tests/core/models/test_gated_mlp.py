"""GatedMLP on CPU computes long inputs in row chunks (layers.CPU_MLP_ROWS): same rows out."""

import pytest
import torch
import torch.nn.functional as F
from omni_core.models import layers
from omni_core.models.layers import GatedMLP


@pytest.mark.parametrize("rows", [1, layers.CPU_MLP_ROWS, layers.CPU_MLP_ROWS + 1, 2 * layers.CPU_MLP_ROWS + 77])
def test_row_chunks_give_the_whole_batch_result(rows):
    torch.manual_seed(0)
    mlp = GatedMLP(32, 96)
    x = torch.randn(rows, 32)
    with torch.inference_mode():
        out = mlp(x)
    gate, up = F.linear(x, mlp.gate_up_proj.weight).chunk(2, dim=-1)
    reference = F.linear(F.silu(gate) * up, mlp.down_proj.weight)
    assert out.shape == (rows, 32)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)
