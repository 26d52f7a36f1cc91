"""The cluster attention kernel's CUDA source compiles for Hopper with NVRTC (no GPU needed)
without spilling registers, at both cluster sizes, and the shapes it takes. Its results are
tested on a Hopper GPU (test_cluster_attention.py)."""

import re

import pytest
from omni_core.models.kernels import cluster_attention, cuda_rtc
from omni_core.models.kernels.cluster_attention import AttentionShape

from tests.core.models.test_decode_step_compiles import _nvrtc_missing

QWEN2_05B = AttentionShape(hidden=896, heads=14, kv_heads=2, head_dim=64, kv_block=16, has_bias=True, has_residual=True)


@pytest.mark.skipif(_nvrtc_missing() is not None, reason=f"{_nvrtc_missing()}")
@pytest.mark.parametrize("cluster", cluster_attention.CLUSTER_SIZES)
@pytest.mark.parametrize("shape", [QWEN2_05B, AttentionShape(256, 4, 1, 64, 64, False, False, rope_bf16=False)])
def test_the_kernel_compiles_without_spills(shape, cluster, monkeypatch):
    logs = []
    compile_source = cuda_rtc.compile_source

    def with_ptxas_report(source, arch, file_name, options=()):
        cubin, log = compile_source(source, arch, file_name, (*options, "--ptxas-options=-v"))
        logs.append(log)
        return cubin, log

    monkeypatch.setattr(cuda_rtc, "compile_source", with_ptxas_report)
    cubin = cluster_attention._compiled.__wrapped__(shape, cluster, "sm_90a")
    assert cubin[:4] == b"\x7fELF"
    assert "Compiling entry function 'cluster_attention' for 'sm_90a'" in logs[0]
    assert re.findall(r"(\d+) bytes spill stores", logs[0]) == ["0"]


def test_the_shapes_it_takes():
    assert QWEN2_05B.unsupported(16) is None and QWEN2_05B.unsupported(8) is None
    assert QWEN2_05B.rows_per_warp(16) == 5  # 288 column pairs over 16 blocks: 36 rows over 8 warps
    assert QWEN2_05B.rows_per_warp(8) == 9
    assert "head size" in AttentionShape(896, 14, 2, 128, 16, True, True).unsupported(16)
    assert "multiple of 128" in AttentionShape(900, 14, 2, 64, 16, True, True).unsupported(16)
    assert "query heads" in AttentionShape(2048, 32, 1, 64, 16, True, True).unsupported(16)
    assert "registers" in AttentionShape(1536, 12, 1, 64, 16, True, True).unsupported(8)  # 14 x 32 pairs over 8 blocks


def test_launch_attributes_carry_every_byte():
    # the cluster size's y and z (1 each) follow zero bytes: all must reach the driver
    attrs, count = cuda_rtc.launch_attributes(dependent=True, cluster=16)
    assert count == 2
    assert (attrs[0].id, bytes(attrs[0].value)[:4]) == (cuda_rtc.LAUNCH_ATTRIBUTE_PROGRAMMATIC_SERIALIZATION, (1).to_bytes(4, "little"))
    assert attrs[1].id == cuda_rtc.LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    assert bytes(attrs[1].value) == bytes.fromhex("10000000" "01000000" "01000000") + bytes(52)
    assert cuda_rtc.launch_attributes()[1] == 0
