"""The one-kernel batch-1 decode's CUDA source compiles for Hopper with NVRTC (no GPU needed; the
test requirements bring NVRTC): for the Qwen2-0.5B shape the GPU benchmarks use and the tiny
shape of the GPU tests, with and without its timer marks. The kernel's results are tested on a
Hopper GPU (test_decode_step_kernel.py)."""

import pytest
from omni_core.models.kernels import cuda_rtc, decode_step
from omni_core.models.kernels.decode_step import StepShape


def _nvrtc_missing() -> str | None:
    try:
        cuda_rtc.nvrtc()
    except cuda_rtc.CudaRtcError as exc:
        return str(exc)
    return None


pytestmark = pytest.mark.skipif(_nvrtc_missing() is not None, reason=f"{_nvrtc_missing()}")

SHAPES = {
    "qwen2-0.5b": StepShape(hidden=896, heads=14, kv_heads=2, head_dim=64, inter=4864, layers=24, kv_block=16, has_bias=True),
    "gpu-test": StepShape(hidden=256, heads=4, kv_heads=2, head_dim=64, inter=512, layers=3, kv_block=16, has_bias=True),
    "no-bias": StepShape(hidden=256, heads=4, kv_heads=1, head_dim=64, inter=512, layers=2, kv_block=64, has_bias=False),
}


@pytest.mark.parametrize("profile", [False, True])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_kernel_compiles_for_hopper(name, profile, monkeypatch):
    logs = []
    compile_source = cuda_rtc.compile_source

    def with_ptxas_report(source, arch, file_name, options=()):
        cubin, log = compile_source(source, arch, file_name, (*options, "--ptxas-options=-v"))
        logs.append(log)
        return cubin, log

    monkeypatch.setattr(cuda_rtc, "compile_source", with_ptxas_report)
    cubin = decode_step._compiled.__wrapped__(SHAPES[name], 132, "sm_90a", profile)
    assert cubin[:4] == b"\x7fELF" and b"decode_step" in cubin
    assert "Compiling entry function 'decode_step' for 'sm_90a'" in logs[0]


def test_a_source_error_comes_back_with_the_compiler_log():
    with pytest.raises(cuda_rtc.CudaRtcError, match="does not compile for sm_90a"):
        cuda_rtc.compile_source('extern "C" __global__ void k() { undefined_name(); }', "sm_90a", "broken.cu")
