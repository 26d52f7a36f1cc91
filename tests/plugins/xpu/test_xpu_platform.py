"""The xpu platform through the real plugin manager and the real torch of this environment: it
registers, and where torch has no usable XPU it says why in torch's own words."""

from __future__ import annotations

import json

import pytest
import torch
from omni_core.hooks import get_plugin_manager
from omni_core.platforms import PlatformUnavailableError, resolve_platform

from tests.helpers.packaging import env_with_path, run_omni

no_xpu = pytest.mark.skipif(torch.xpu.is_available(), reason="an XPU is present: the platform is available")


def torch_reason() -> str:
    """What torch itself says when asked to start XPU here."""
    try:
        torch.xpu.init()
    except Exception as exc:
        return str(exc)
    return ""


def test_the_plugin_registers_the_xpu_platform():
    manager = get_plugin_manager()
    record = next(r for r in manager.records if r.name == "xpu")
    assert (record.dist, record.status, record.error) == ("omni-xpu", "ok", None)
    assert record.provides()["platforms"] == ["xpu"]
    xpu = manager.platform("xpu")
    assert (xpu.device_type, xpu.device(0), xpu.device(3)) == ("xpu", "xpu:0", "xpu:3")
    assert (xpu.dist_backend, xpu.supports_graphs, xpu.attention_backend) == ("xccl", False, "sdpa")
    assert xpu.accelerator and {"float32", "float16"} <= set(xpu.dtypes)


def test_omni_plugins_list_shows_it():
    listing = json.loads(run_omni(["plugins", "list", "--json"], env_with_path(OMNI_PLUGINS="xpu")).stdout)
    item = next(i for i in listing if i["name"] == "xpu")
    assert item["provides"]["platforms"] == ["xpu"] and item["status"] == "ok"


@no_xpu
def test_unavailable_with_the_reason_torch_gives():
    ok, reason = get_plugin_manager().platform("xpu").is_available()
    assert not ok
    assert reason.startswith(f"torch {torch.__version__}: ")
    assert torch_reason() and torch_reason() in reason
    if torch.version.xpu is None:  # a build without XPU: say which build has it
        assert "pip install torch --index-url https://download.pytorch.org/whl/xpu" in reason
    with pytest.raises(PlatformUnavailableError) as error:
        resolve_platform("xpu")
    assert str(error.value) == f"platform 'xpu' is not available: {reason}"


@no_xpu
def test_omni_env_shows_it_unavailable_and_why():
    env = env_with_path(OMNI_PLUGINS="xpu")
    report = json.loads(run_omni(["env", "--json"], env).stdout)
    xpu = next(p for p in report["platforms"] if p["name"] == "xpu")
    reason = get_plugin_manager().platform("xpu").is_available()[1]
    assert xpu["available"] is False and xpu["reason"] == reason and xpu["devices"] == []
    assert (xpu["dist_backend"], xpu["supports_graphs"], xpu["attention_backend"]) == ("xccl", False, "sdpa")
    text = run_omni(["env"], env).stdout
    assert f"xpu   unavailable: {reason}" in text
