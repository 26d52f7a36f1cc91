"""A preset with random weights says so once per process and checkpoint, however many times the
family's build runs."""

import logging

from omni_core.hooks import warn_random_weights


def test_the_warning_is_given_once_per_checkpoint(caplog):
    with caplog.at_level(logging.WARNING, logger="omni.presets"):
        for _ in range(3):
            warn_random_weights("acme", "/ckpt/a", "tiny", "audio")
        warn_random_weights("acme", "/ckpt/b", "tiny", "audio")
    messages = [r.getMessage() for r in caplog.records if r.name == "omni.presets"]
    assert messages == ["acme: /ckpt/a holds the 'tiny' preset (random weights): its audio is noise",
                        "acme: /ckpt/b holds the 'tiny' preset (random weights): its audio is noise"]
