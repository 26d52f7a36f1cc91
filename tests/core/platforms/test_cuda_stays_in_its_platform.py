"""Core code outside ``omni_core/platforms`` asks a device's platform what it can do: it calls no
``torch.cuda`` function and compares no device type with "cuda", so a platform that a plugin
adds (xpu) runs the same code. Only the modules below are CUDA by nature."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[3] / "core" / "omni_core"

ALLOWED = {
    "platforms/": "the platforms themselves",
    "models/kernels/": "CUDA and Triton kernels, compiled for NVIDIA GPUs",
    "scheduler/graph_capture.py": "CUDA-graph capture (asked for only where Platform.supports_graphs)",
    "comm/nccl.py": "the NCCL transport, GPU to GPU",
}


def _is_torch_cuda(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "cuda" and isinstance(node.value, ast.Name) and node.value.id == "torch"


def cuda_assumptions(source: str) -> list[tuple[int, str]]:
    """(line, what) for each torch.cuda call, torch.cuda import and comparison with "cuda"."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is_torch_cuda(node.func.value):
            found.append((node.lineno, f"torch.cuda.{node.func.attr}()"))
        elif isinstance(node, ast.ImportFrom) and node.module and (node.module.startswith("torch.cuda") or
                                                                    (node.module == "torch" and any(a.name == "cuda" for a in node.names))):
            found.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Compare) and any(isinstance(c, ast.Constant) and c.value == "cuda" for c in [node.left, *node.comparators]):
            found.append((node.lineno, 'a comparison with "cuda"'))
    return found


def test_the_check_sees_what_it_looks_for():
    source = 'import torch\nif d.type == "cuda":\n    torch.cuda.synchronize(d)\nfrom torch.cuda import Event\n'
    assert sorted(cuda_assumptions(source)) == [(2, 'a comparison with "cuda"'), (3, "torch.cuda.synchronize()"), (4, "from torch.cuda import ...")]


def test_core_outside_the_allowed_modules_assumes_no_cuda():
    offenders = []
    for path in sorted(CORE.rglob("*.py")):
        relative = path.relative_to(CORE).as_posix()
        if any(relative.startswith(prefix) for prefix in ALLOWED):
            continue
        offenders += [f"{relative}:{line}: {what}" for line, what in cuda_assumptions(path.read_text())]
    assert not offenders, "ask the device's platform (omni_core.platforms.platform_for) instead:\n" + "\n".join(offenders)


def test_every_allowed_module_exists():
    assert all((CORE / prefix).exists() for prefix in ALLOWED)
