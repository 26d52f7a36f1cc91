"""For families whose presets hold random weights: one warning that the output is noise, once per
process and checkpoint, however many times the family's ``build`` runs (``omni serve`` builds the
topology to check it, then again to serve it)."""

from __future__ import annotations

import functools
import logging

log = logging.getLogger("omni.presets")


@functools.cache
def warn_random_weights(family: str, checkpoint_dir: str, preset: str, output: str = "output") -> None:
    log.warning("%s: %s holds the %r preset (random weights): its %s is noise", family, checkpoint_dir, preset, output)
