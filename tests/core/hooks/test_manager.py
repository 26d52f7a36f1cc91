"""The plugin manager through real pluggy registration: validation and lookups."""

from __future__ import annotations

import types

import pytest
from omni_core.hooks import EngineSpec, FamilySpec, PluginManager, UnknownNameError, hookimpl


def plugin(**hooks) -> types.SimpleNamespace:
    return types.SimpleNamespace(**{name: hookimpl(fn) for name, fn in hooks.items()})


@pytest.fixture
def manager():
    return PluginManager(selection=set())  # built-ins only


def test_builtins_resolve_by_name(manager):
    assert manager.platform("cpu").is_available() == (True, "")
    assert {"inproc", "shm", "zmq", "nccl"} <= set(manager.transports())
    assert manager.engine("batch").name == "batch"


def test_unknown_family_lists_installed_ones(manager):
    manager.register_object("fam", plugin(omni_families=lambda: [FamilySpec("alpha", ("speech",), build=lambda c, o: None)]))
    with pytest.raises(UnknownNameError, match=r"unknown family 'beta'; installed: alpha"):
        manager.family("beta")


def test_registration_hook_returning_wrong_type_is_an_error(manager):
    record = manager.register_object("wrong", plugin(omni_engines=lambda: [{"name": "x"}]))
    assert record.status == "error"
    assert "expected EngineSpec" in record.error
    assert "x" not in manager.engines()


def test_registration_hook_that_raises_is_an_error_and_others_still_work(manager):
    def explode():
        raise RuntimeError("weights folder missing")

    bad = manager.register_object("bad", plugin(omni_families=explode))
    good = manager.register_object("good", plugin(omni_engines=lambda: [EngineSpec("mine", build=lambda s, c: None)]))
    assert (bad.status, bad.error) == ("error", "RuntimeError: weights folder missing")
    assert good.status == "ok"
    assert manager.engine("mine").name == "mine"


def test_hook_with_wrong_arguments_is_an_error(manager):
    record = manager.register_object("args", plugin(omni_stage_hooks=lambda family, stage, options, extra: None))
    assert record.status == "error"
    assert "extra" in record.error


def test_unknown_task_is_refused():
    with pytest.raises(ValueError, match="unknown tasks"):
        FamilySpec("x", ("sing",), build=lambda c, o: None)


def test_builtins_win_name_clashes(manager):
    from omni_core.hooks import TransportSpec

    manager.register_object("clash", plugin(omni_transports=lambda: [TransportSpec("shm", factory=lambda o: "mine")]))
    assert manager.transport("shm").description.startswith("shared memory")
    assert manager.records[-1].status == "ok"  # the clashing plugin still loads; only the name is taken


def test_stage_hooks_first_answer_wins(manager):
    manager.register_object("h1", plugin(omni_stage_hooks=lambda family, stage, options: None))
    manager.register_object("h2", plugin(omni_stage_hooks=lambda family, stage, options: f"{family}/{stage}"))
    assert manager.stage_hooks("fam", "llm", {}) == "fam/llm"
