"""`omni serve --device xpu` where it cannot run: one line and exit 2, before anything loads."""

from __future__ import annotations

import pytest
import torch
from omni_core.hooks import get_plugin_manager

from tests.core.serve.server import install_testfamily
from tests.helpers.packaging import env_with_path, run_omni

pytestmark = pytest.mark.skipif(torch.xpu.is_available(), reason="an XPU is present")

SERVE = ["serve", "--family", "testfamily", "--preset", "tiny"]


@pytest.fixture(scope="module")
def testfamily_site(tmp_path_factory):
    return install_testfamily(tmp_path_factory.mktemp("testfamily-site"))


def _error_lines(stderr: str) -> list[str]:
    """stderr without the line `omni serve` prints first, that it is starting."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("omni serve: starting")]


def test_no_xpu_here_exits_2_with_the_platform_reason(testfamily_site):
    result = run_omni([*SERVE, "--device", "xpu"], env_with_path(testfamily_site, OMNI_PLUGINS="testfamily,xpu"))
    reason = get_plugin_manager().platform("xpu").is_available()[1]
    assert result.returncode == 2
    assert _error_lines(result.stderr) == [f"omni serve: --device xpu: platform 'xpu' is not available: {reason}"]


def test_a_stage_device_on_xpu_is_checked_too(testfamily_site):
    result = run_omni([*SERVE, "--stage-device", "tts=xpu:0"], env_with_path(testfamily_site, OMNI_PLUGINS="testfamily,xpu"))
    assert result.returncode == 2
    (line,) = _error_lines(result.stderr)
    assert line.startswith("omni serve: --stage-device tts=xpu:0: platform 'xpu' is not available: ")


def test_without_the_plugin_it_names_the_package(testfamily_site):
    result = run_omni([*SERVE, "--device", "xpu"], env_with_path(testfamily_site, OMNI_PLUGINS="testfamily"))
    assert result.returncode == 2
    (line,) = _error_lines(result.stderr)
    assert line.startswith("omni serve: --device xpu: unknown platform 'xpu'; installed: cpu, cuda")
    assert line.endswith("platforms come in plugin packages (docs/platforms.md lists them)")


def test_help_lists_the_installed_platforms_devices(testfamily_site):
    with_xpu = run_omni(["serve", "--help"], env_with_path(testfamily_site, OMNI_PLUGINS="xpu")).stdout
    without = run_omni(["serve", "--help"], env_with_path(testfamily_site, OMNI_PLUGINS="")).stdout
    assert "cpu, cuda, xpu" in " ".join(with_xpu.split())
    assert "xpu" not in without and "cpu, cuda" in " ".join(without.split())
