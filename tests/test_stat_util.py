"""Tests for specstudy.core.stat_util: the one percentile function."""

from __future__ import annotations

import random

import numpy as np
import pytest

from specstudy.core.stat_util import percentile


def test_linear_equals_numpy_to_the_last_bit():
    rng = random.Random(7)
    for _ in range(500):
        xs = [rng.lognormvariate(3, 1) for _ in range(rng.randint(1, 30))]
        for q in (0, 1, 25, 50, 75, 90, 95, 99, 100, rng.uniform(0, 100)):
            assert percentile(xs, q) == float(np.percentile(np.asarray(xs, float), q, method="linear")), (xs, q)


def test_linear_small_cases():
    assert percentile([10, 20, 30, 40], 50) == 25.0
    assert percentile([10, 20, 30, 40], 95) == float(np.percentile([10, 20, 30, 40], 95))
    assert percentile([5], 99) == 5.0
    assert percentile([3, 1, 2], 0) == 1.0 and percentile([3, 1, 2], 100) == 3.0


def test_nearest_rank_is_always_a_value():
    s = list(range(1, 21))
    assert percentile(s, 95, method="nearest_rank") == 19  # ceil(0.95 * 20) = 19th value
    assert percentile(s, 100, method="nearest_rank") == 20
    assert percentile(s, 0, method="nearest_rank") == 1
    assert percentile([7, 3], 50, method="nearest_rank") == 3
    assert isinstance(percentile([1, 2, 3], 50, method="nearest_rank"), int)


def test_none_and_empty():
    assert percentile([], 50) is None
    assert percentile([None, None], 50) is None
    assert percentile([None, 4.0, 2.0], 50) == 3.0


def test_bad_arguments():
    with pytest.raises(ValueError, match="method"):
        percentile([1, 2], 50, method="hazen")
    with pytest.raises(ValueError, match="0..100"):
        percentile([1, 2], 101)
