"""How ``--device`` picks a platform and which platform owns a device, through the real
platforms this environment installs (cpu and cuda from omni-core, xpu and mlx from plugins)."""

from __future__ import annotations

import pytest
import torch
from omni_core.hooks import PluginManager, UnknownNameError, get_plugin_manager
from omni_core.models import SdpaBackend, resolve_attention_backend
from omni_core.platforms import Platform, PlatformUnavailableError, platform_for, resolve_platform
from omni_core.platforms.select import auto_order


@pytest.fixture(scope="module")
def platforms():
    installed = get_plugin_manager().platforms()
    missing = {"cpu", "cuda", "xpu", "mlx"} - set(installed)
    if missing:
        pytest.skip(f"needs the platform plugins installed (scripts/setup.sh); missing: {', '.join(sorted(missing))}")
    return installed


def test_auto_tries_cuda_then_xpu_then_cpu_then_mlx(platforms):
    order = [p.name for p in auto_order(platforms.values())]
    assert order == ["cuda", "xpu", "cpu", "mlx"]


def test_auto_takes_the_first_available_in_that_order(platforms):
    chosen = resolve_platform("auto")
    assert chosen is next(p for p in auto_order(platforms.values()) if p.is_available()[0])
    if not torch.cuda.is_available() and not torch.xpu.is_available():
        assert chosen.name == "cpu"  # mlx is usable here too, but never before cpu: torch families need a torch device


def test_a_named_platform_must_be_available_here(platforms):
    ok, reason = platforms["cuda"].is_available()
    if ok:
        assert resolve_platform("cuda") is platforms["cuda"]
        return
    with pytest.raises(PlatformUnavailableError) as error:
        resolve_platform("cuda")
    assert str(error.value) == f"platform 'cuda' is not available: {reason}"


def test_a_device_index_must_exist():
    assert resolve_platform("cpu:0").name == "cpu"
    with pytest.raises(PlatformUnavailableError, match=r"no device 'cpu:1': cpu has 1 here"):
        resolve_platform("cpu:1")
    with pytest.raises(PlatformUnavailableError, match="no device 'cpu:x'"):
        resolve_platform("cpu:x")


def test_a_platform_not_installed_says_where_platforms_come_from():
    # core names no backend (xpu's package included): the platforms page lists the plugins
    builtins_only = PluginManager(selection=set())
    for name in ("xpu", "tpu"):
        with pytest.raises(UnknownNameError) as error:
            resolve_platform(name, builtins_only)
        assert str(error.value) == (
            f"unknown platform {name!r}; installed: cpu, cuda; platforms come in plugin packages (docs/platforms.md lists them)"
        )


def test_platform_for_finds_the_owner_of_a_device(platforms):
    # the process keeps the first platform found for a type (a stage's, from its own plugin
    # manager): the same class, not necessarily this manager's object
    for device, name in [("cpu", "cpu"), (torch.device("cpu"), "cpu"), ("xpu:1", "xpu"), (torch.device("cuda", 0), "cuda")]:
        assert type(platform_for(device)) is type(platforms[name])
    assert platform_for("xpu:1", get_plugin_manager()) is platforms["xpu"]
    unclaimed = platform_for("meta")
    assert type(unclaimed) is Platform and not unclaimed.accelerator and not unclaimed.supports_graphs


def test_what_the_engine_asks_of_each_platform(platforms):
    cpu, cuda, xpu = platforms["cpu"], platforms["cuda"], platforms["xpu"]
    assert (cpu.accelerator, cuda.accelerator, xpu.accelerator) == (False, True, True)
    assert (cpu.supports_graphs, cuda.supports_graphs, xpu.supports_graphs) == (False, True, False)
    assert (cpu.dist_backend, cuda.dist_backend, xpu.dist_backend) == ("gloo", "nccl", "xccl")
    assert cpu.default_dtype == "float32" and cuda.default_dtype == "bfloat16"
    # attention: sdpa on the host and on XPU, whatever triton can do here
    assert isinstance(resolve_attention_backend(None, "cpu"), SdpaBackend)
    assert isinstance(resolve_attention_backend(None, "xpu:0"), SdpaBackend)


def test_the_cpu_describes_itself_with_its_memory(platforms):
    info = platforms["cpu"].describe()
    assert info["available"] and info["reason"] is None
    (device,) = info["devices"]
    assert device["device"] == "cpu" and device["name"]
    assert 0 < device["free_bytes"] <= device["total_bytes"]
