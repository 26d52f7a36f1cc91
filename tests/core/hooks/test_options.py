"""Family build options that size batches and chunks: a value that would make a stage wait or
loop forever fails the build with a message naming the option."""

from __future__ import annotations

import pytest
from omni_core.hooks import choice_option, engine_graph_options, flag_option, number_option


@pytest.mark.parametrize("raw", [0, -3, "x", True, 2.5, float("nan"), float("inf"), None])
def test_a_batch_size_that_is_not_a_positive_integer_is_refused(raw):
    with pytest.raises(ValueError, match=r"option max_batch=.*: expected an integer above 0"):
        number_option({"max_batch": raw}, "max_batch", 32)


def test_good_values_and_defaults():
    assert number_option({}, "max_batch", 32) == 32
    assert number_option({"max_batch": "8"}, "max_batch", 32) == 8 and number_option({"max_batch": 4.0}, "max_batch", 32) == 4
    assert number_option({"chunk_seconds": 0.5}, "chunk_seconds", 30.0, float) == 0.5
    assert number_option({"window_ms": 0}, "window_ms", 5.0, float, allow_zero=True) == 0.0
    with pytest.raises(ValueError, match="expected a number above 0"):
        number_option({"chunk_seconds": 0}, "chunk_seconds", 30.0, float)


def test_a_flag_is_plainly_true_or_false():
    assert flag_option({}, "cuda_graphs", True) is True
    assert [flag_option({"f": raw}, "f", True) for raw in (False, "false", "False", "no", "OFF", "0", 0)] == [False] * 7
    assert [flag_option({"f": raw}, "f", False) for raw in (True, "true", "Yes", "on", "1", 1)] == [True] * 6
    for raw in ("maybe", "2", "", None):
        with pytest.raises(ValueError, match=r"option f=.*: expected true or false"):
            flag_option({"f": raw}, "f", False)


def test_a_choice_is_one_of_its_values_the_first_by_default():
    assert choice_option({}, "schedule", ("arrival", "deadline")) == "arrival"
    assert choice_option({"schedule": " Deadline "}, "schedule", ("arrival", "deadline")) == "deadline"
    with pytest.raises(ValueError, match=r"option schedule='soon': expected 'arrival' or 'deadline'"):
        choice_option({"schedule": "soon"}, "schedule", ("arrival", "deadline"))


def test_graph_options_become_engine_config_fields():
    from omni_core.scheduler import EngineConfig

    assert engine_graph_options({}) == {"cuda_graphs": True}
    assert EngineConfig(**engine_graph_options({})).cuda_graph_prefill_tokens  # the engine's default sizes
    off = EngineConfig(**engine_graph_options({"prefill_graphs": "off"}))
    assert off.cuda_graphs and off.cuda_graph_prefill_tokens == ()
    assert engine_graph_options({"cuda_graphs": "false"}) == {"cuda_graphs": False}
    with pytest.raises(ValueError, match="option prefill_graphs='sometimes'"):
        engine_graph_options({"prefill_graphs": "sometimes"})


def test_a_key_the_family_does_not_declare_is_refused_naming_it_and_the_known_ones():
    from omni_core.hooks import FamilySpec, check_option_names

    spec = FamilySpec(name="acme", tasks=("speech",), build=lambda d, o: None, options={"dtype": "...", "max_batch": "..."})
    check_option_names(spec, {"dtype": "bfloat16"})
    with pytest.raises(ValueError, match=r"family 'acme' has no option 'dtyp'; its options: dtype, max_batch"):
        check_option_names(spec, {"dtyp": "bfloat16", "max_batch": 4})
    check_option_names(FamilySpec(name="free", tasks=("speech",), build=lambda d, o: None), {"anything": 1})  # undeclared


def test_every_installed_family_declares_each_option_its_code_reads():
    """A scan of each family package's source for the option keys it reads by name
    (``options.get("k"...)``, ``number_option(options, "k"...)``): each must be declared, or
    ``--option k=...`` would be refused though the family uses it."""
    import importlib.util
    import re
    from pathlib import Path

    from omni_core.hooks import get_plugin_manager

    read = re.compile(r'(?:options\.get\(|(?:number|flag)_option\(\s*[\w.]*options,\s*)"(\w+)"')
    checked = []
    for name, spec in get_plugin_manager().families().items():
        if spec.options is None:
            continue
        package = importlib.util.find_spec(spec.build.__module__.split(".")[0]).submodule_search_locations[0]
        keys = {key for path in Path(package).rglob("*.py") for key in read.findall(path.read_text(encoding="utf-8"))}
        assert keys, name
        assert keys <= set(spec.options), f"{name} reads undeclared options {sorted(keys - set(spec.options))}"
        checked.append(name)
    assert {"cosyvoice3", "qwen3-omni", "whisper"} <= set(checked)
