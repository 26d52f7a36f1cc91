"""`omni serve --placement ray` where Ray cannot be imported: exit 2 before anything loads, one
line naming what to install. Ray is hidden by a package of the same name that fails to import."""

from __future__ import annotations

from tests.helpers.packaging import env_with_path, run_omni


def test_placement_ray_without_ray_exits_2_naming_the_extra(testfamily_site, tmp_path):
    hidden = tmp_path / "hidden"
    (hidden / "ray").mkdir(parents=True)
    (hidden / "ray" / "__init__.py").write_text('raise ImportError("Ray is hidden in this test")\n')
    env = env_with_path(
        hidden, testfamily_site, OMNI_PLUGINS="testfamily", OMNI_CACHE=str(tmp_path / "cache")
    )
    result = run_omni(["serve", "--family", "testfamily", "--preset", "tiny", "--placement", "tts=ray"], env)
    assert result.returncode == 2, result.stderr
    assert "omni serve: placement 'ray' needs Ray: pip install 'omni-core[ray]'" in result.stderr
    assert "Traceback" not in result.stderr
