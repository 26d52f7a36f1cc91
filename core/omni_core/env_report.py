"""What ``omni env`` reports: the versions, plugins, platforms and devices a bug report needs.

Nothing here may raise on a broken install: a plugin that fails to load or a driver that fails
a query is reported as such, since those are what a report is for.
"""

from __future__ import annotations

import os
import platform as host
import sys
from importlib import metadata
from typing import Any

from omni_core import __version__
from omni_core.platforms.select import auto_order

# what a report names, by the distributions that provide it (the first one installed counts)
PACKAGES = {
    "torch": ("torch",),
    "transformers": ("transformers",),
    "triton": ("triton", "pytorch-triton-xpu"),
    "mlx": ("mlx",),
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino"),
    "numpy": ("numpy",),
}
# settings that change what omni loads or where it runs (never a secret such as OMNI_API_KEY)
ENVIRONMENT = ("OMNI_PLUGINS", "OMNI_CACHE", "OMNI_ATTENTION_BACKEND", "CUDA_VISIBLE_DEVICES",
               "ZE_AFFINITY_MASK", "ONEAPI_DEVICE_SELECTOR", "OMP_NUM_THREADS", "HF_HUB_OFFLINE")


def package_version(name: str) -> str | None:
    for dist in PACKAGES.get(name, (name,)):
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        return version if dist == name else f"{version} ({dist})"
    return None


def torch_build() -> dict[str, Any]:
    """The accelerators torch was built for, and its CPU threads."""
    try:
        import torch
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "cuda": torch.version.cuda,
        "xpu": getattr(torch.version, "xpu", None),
        "threads": torch.get_num_threads(),
    }


def cpu_info() -> dict[str, Any]:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cores": os.cpu_count(), "usable_cores": usable, "machine": host.machine()}


def platform_reports(manager: Any) -> tuple[list[dict[str, Any]], str | None]:
    """Each registered platform, in the order ``--device auto`` tries them, and the one it picks."""
    reports = []
    for platform in auto_order(manager.platforms().values()):
        try:
            reports.append(platform.describe())
        except Exception as exc:  # a third party's platform is reported, never fatal
            reports.append({"name": platform.name, "available": False, "reason": f"{type(exc).__name__}: {exc}", "devices": []})
    auto = next((report["name"] for report in reports if report["available"]), None)
    return reports, auto


def environment_report(manager: Any) -> dict[str, Any]:
    platforms, auto = platform_reports(manager)
    return {
        "omni_core": __version__,
        "python": sys.version.split()[0],
        "os": host.platform(),
        "packages": {name: package_version(name) for name in PACKAGES},
        "torch_build": torch_build(),
        "cpu": cpu_info(),
        "plugins": [
            {key: record.to_json()[key] for key in ("name", "dist", "version", "status", "error")}
            for record in manager.records
        ],
        "platforms": platforms,
        "auto_device": auto,
        "environment": {name: os.environ[name] for name in ENVIRONMENT if name in os.environ},
    }
