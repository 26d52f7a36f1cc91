"""Progress of the long parts of a start (loading weight files, capturing graphs): a bar on a
terminal, as huggingface and vLLM draw theirs; in a log (stderr not a terminal) one plain line a
step, so a log file gets no carriage returns."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator, Sequence
from typing import TypeVar

log = logging.getLogger("omni.progress")
T = TypeVar("T")


def each(items: Sequence[T], what: str) -> Iterator[T]:
    """``items`` one by one, saying how far ``what`` has got (nothing for fewer than two)."""
    if len(items) < 2:
        yield from items
        return
    if sys.stderr.isatty():
        from tqdm import tqdm

        yield from tqdm(items, desc=what, unit="", leave=False)
        return
    for done, item in enumerate(items):
        yield item
        log.info("%s: %d of %d", what, done + 1, len(items))
