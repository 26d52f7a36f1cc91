"""Discovery through real installed distributions and their entry points."""

from __future__ import annotations

import pytest

from tests.helpers.packaging import FIXTURES, env_with_path, pip_install_target, plugins_json, run_omni

PLUGINS = FIXTURES / "plugins"


FIXTURE_PLUGINS = "fixture-good,fixture-broken,fixture-badhook"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    pip_install_target([PLUGINS / "omni-fixture-good", PLUGINS / "omni-fixture-broken", PLUGINS / "omni-fixture-badhook"], target)
    return target


@pytest.fixture(scope="module")
def listing(installed):
    """One real `omni plugins list --json` run over the fixtures (other installed families left out)."""
    return plugins_json(env_with_path(installed, OMNI_PLUGINS=FIXTURE_PLUGINS))


def by_name(items):
    return {item["name"]: item for item in items}


def test_builtins_are_listed_as_omni_core(listing):
    items = by_name(listing)
    for name in ("platforms", "transports", "engines"):
        assert items[name]["dist"] == "omni-core"
        assert items[name]["status"] == "ok", items[name]["error"]
    assert set(items["platforms"]["provides"]["platforms"]) >= {"cpu", "cuda"}
    assert set(items["transports"]["provides"]["transports"]) >= {"inproc", "shm", "zmq", "nccl"}
    assert set(items["engines"]["provides"]["engines"]) >= {"fn", "batch", "ar"}
    assert items["engines"]["hooks"] == ["omni_engines"]


def test_json_items_have_the_documented_fields(listing):
    for item in listing:
        assert set(item) >= {"name", "dist", "version", "provides", "hooks", "status", "error"}
        assert set(item["provides"]) == {"families", "platforms", "transports", "engines"}


def test_working_plugin_is_discovered_through_its_entry_point(listing):
    good = by_name(listing)["fixture-good"]
    assert good == {
        "name": "fixture-good",
        "dist": "omni-fixture-good",
        "version": "0.3.1",
        "provides": {"families": [], "platforms": ["fixture-accel"], "transports": ["fixture-pipe"], "engines": []},
        "hooks": ["omni_platforms", "omni_transports"],
        "status": "ok",
        "error": None,
    }


def test_plugin_whose_import_fails_is_listed_with_its_error(listing):
    broken = by_name(listing)["fixture-broken"]
    assert broken["status"] == "error"
    assert "omni_fixture_dependency_that_is_not_installed" in broken["error"]
    assert broken["provides"] == {"families": [], "platforms": [], "transports": [], "engines": []}


def test_unknown_hook_name_is_rejected(listing):
    bad = by_name(listing)["fixture-badhook"]
    assert bad["status"] == "error"
    assert "omni_famillies" in bad["error"]


def test_table_output_shows_status_and_errors(installed):
    result = run_omni(["plugins", "list"], env_with_path(installed, COLUMNS="200", OMNI_PLUGINS=FIXTURE_PLUGINS))
    assert result.returncode == 0, result.stderr
    assert "fixture-good" in result.stdout
    assert "fixture-accel" in result.stdout
    assert "error" in result.stdout


def test_omni_plugins_selects_third_party_plugins(installed):
    none = by_name(plugins_json(env_with_path(installed, OMNI_PLUGINS="")))
    assert not any(item["dist"] != "omni-core" for item in none.values())
    assert {"platforms", "transports", "engines"} <= set(none)
    only_good = by_name(plugins_json(env_with_path(installed, OMNI_PLUGINS="fixture-good")))
    third_party = {name for name, item in only_good.items() if item["dist"] != "omni-core"}
    assert third_party == {"fixture-good"}


def test_a_long_error_is_shown_whole_in_a_narrow_table(installed):
    env = env_with_path(installed, COLUMNS="80", OMNI_PLUGINS=FIXTURE_PLUGINS)
    error = by_name(plugins_json(env))["fixture-broken"]["error"]
    result = run_omni(["plugins", "list"], env)
    assert result.returncode == 0, result.stderr
    # the rows' cells, each joined over the lines the table folds it onto
    rows: list[list[str]] = []
    for line in result.stdout.splitlines():
        if not line.startswith("│"):
            continue
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        if cells[0] or not rows:
            rows.append(cells)
        else:
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells, strict=True)]
    status = {"".join(row[0].split()): row[-1] for row in rows}["fixture-broken"]
    assert "".join(status.split()) == "".join(f"error: {error}".split())
