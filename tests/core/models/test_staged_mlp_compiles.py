"""The staged decode MLP's CUDA source compiles for Hopper with NVRTC (no GPU needed) without
spilling registers, and the shapes it takes on an H200's shared memory. Its results are tested on
a Hopper GPU (test_staged_mlp.py)."""

import re

import pytest
from omni_core.models.kernels import cuda_rtc, staged_mlp
from omni_core.models.kernels.staged_mlp import MlpShape

from tests.core.models.test_decode_step_compiles import _nvrtc_missing

H200 = dict(blocks=132, block_limit=232448, multiprocessor_limit=233472)  # its multiprocessors and shared memory (bytes)


@pytest.mark.skipif(_nvrtc_missing() is not None, reason=f"{_nvrtc_missing()}")
@pytest.mark.parametrize("profile", [0, 1])
@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("hidden,inter", [(896, 4864), (256, 512), (384, 1000)])
def test_both_kernels_compile_without_spills(hidden, inter, rows, profile, monkeypatch):
    logs = []
    compile_source = cuda_rtc.compile_source

    def with_ptxas_report(source, arch, file_name, options=()):
        cubin, log = compile_source(source, arch, file_name, (*options, "--ptxas-options=-v"))
        logs.append(log)
        return cubin, log

    monkeypatch.setattr(cuda_rtc, "compile_source", with_ptxas_report)
    layout = MlpShape(hidden, inter, rows).layout(132)
    defines = {"HIDDEN": hidden, "INTER": inter, "THREADS": staged_mlp.THREADS, "ROWS": rows, "GU_ROWS": layout["GU_ROWS"], "DN_ROWS": layout["DN_ROWS"], "PROFILE": profile}
    cubin = staged_mlp._compiled.__wrapped__(tuple(defines.items()), "sm_90a")
    assert cubin[:4] == b"\x7fELF"
    for name in ("staged_gate_up", "staged_down"):
        assert f"Compiling entry function '{name}' for 'sm_90a'" in logs[0]
    spills = re.findall(r"(\d+) bytes spill stores", logs[0])
    assert len(spills) == 2 and set(spills) == {"0"}


def test_the_shapes_it_takes():
    assert MlpShape(896, 4864, 1).unsupported(**H200) is None  # Qwen2-0.5B: 136 KB + 68 KB a multiprocessor
    assert MlpShape(896, 4864, 2).unsupported(**H200) is None
    layout = MlpShape(896, 4864, 1).layout(132)
    assert (layout["GU_ROWS"], layout["DN_ROWS"]) == (37, 7)
    assert "shared memory" in MlpShape(1536, 8960, 1).unsupported(**H200)  # Qwen2-1.5B: 2 x 68 rows x 3 KB for gate/up alone
    assert "multiples" in MlpShape(900, 4864, 1).unsupported(**H200)
    assert "rows" in MlpShape(896, 4864, 3).unsupported(**H200)
