"""The family's stage graph and its build options, through the plugin manager (as `omni serve`
finds the family): a bad option fails the build, naming itself, before any stage starts."""

from __future__ import annotations

import pytest
from omni_core.hooks import check_option_names, get_plugin_manager


def test_the_stage_graph_and_its_options(tiny_dir):
    spec = get_plugin_manager().family("fish-s2pro")
    assert (
        spec.sample_rate == 44100 and {"tiny", "full"} <= set(spec.presets) and spec.split_speech is not None
    )
    assert str(spec.reference_limits) == "0.5-30 s at 8000-192000 Hz"
    topology = spec.build(tiny_dir, {"max_batch": 4, "temperature": 0})
    assert [(s.name, s.engine) for s in topology.stages] == [
        ("frontend", "fn"),
        ("dual_ar", "ar"),
        ("codec", "batch"),
    ]
    assert [(e.src, e.dst, e.kind) for e in topology.edges] == [
        ("frontend.prompt", "dual_ar.in", "message"),
        ("dual_ar.codes", "codec.in", "stream"),
    ]
    with pytest.raises(ValueError, match="option top_p must be in"):
        spec.build(tiny_dir, {"top_p": 0})
    with pytest.raises(ValueError, match="option audio_chunk"):
        spec.build(tiny_dir, {"audio_chunk": 0})
    with pytest.raises(ValueError, match="has no option 'voice_id'"):
        check_option_names(spec, {"voice_id": "x"})
