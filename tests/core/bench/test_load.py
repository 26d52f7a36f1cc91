import itertools
import statistics

import pytest
from omni_core.bench.dataset import BenchItem
from omni_core.bench.load import arrival_offsets, request_order


def test_request_order_is_seeded_and_covers_the_dataset():
    items = [BenchItem(text=str(i)) for i in range(5)]
    first = request_order(items, 12, seed=3)
    assert first == request_order(items, 12, seed=3)
    assert first != request_order(items, 12, seed=4)
    assert len(first) == 12
    # Every pass over the data uses each item once before any repeats.
    assert sorted(i.text for i in first[:5]) == sorted(i.text for i in items)
    assert sorted(i.text for i in first[5:10]) == sorted(i.text for i in items)


def test_closed_loop_sends_everything_at_once():
    assert arrival_offsets(4, None, seed=0) == [0.0, 0.0, 0.0, 0.0]


def test_poisson_arrivals_are_seeded_with_the_right_mean_gap():
    offsets = arrival_offsets(4000, 8.0, seed=1)
    assert offsets == arrival_offsets(4000, 8.0, seed=1)
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert statistics.fmean(gaps) == pytest.approx(1 / 8.0, rel=0.05)
    # Exponential gaps: the standard deviation equals the mean.
    assert statistics.pstdev(gaps) == pytest.approx(1 / 8.0, rel=0.1)
    with pytest.raises(ValueError, match="positive"):
        arrival_offsets(3, 0.0, seed=0)
