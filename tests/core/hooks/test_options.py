"""Family build options that size batches and chunks: a value that would make a stage wait or
loop forever fails the build with a message naming the option."""

from __future__ import annotations

import pytest
from omni_core.hooks import number_option


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
