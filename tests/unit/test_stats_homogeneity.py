"""The two-sample categorical test the sampling-correctness checks use (GPU and simulator)."""
from __future__ import annotations

import numpy as np
import pytest

from tuning.stats import categorical_homogeneity_test, chi_square_statistic


def test_chi_square_statistic_matches_the_hand_computed_table():
    # a: x x x y, b: x y y y -> totals x 4, y 4, n 8; expected 2 per cell; (3-2)^2/2 * 4 cells = 2.0
    assert chi_square_statistic(list("xxxy"), list("xyyy")) == pytest.approx(2.0)
    assert chi_square_statistic(list("xy"), list("xy")) == 0.0


def test_samples_of_one_distribution_are_not_rejected_at_the_stated_rate():
    # 40 pairs of samples of one skewed distribution over many rare outcomes: about 1 % of
    # p-values fall below 0.01 (allow up to 3 of 40) - the test's false-alarm rate is what it says.
    rng = np.random.default_rng(1)
    probs = np.array([0.4, 0.2, 0.1] + [0.3 / 60] * 60)
    ps = [categorical_homogeneity_test(list(rng.choice(len(probs), 300, p=probs)),
                                       list(rng.choice(len(probs), 300, p=probs)), permutations=300, seed=i)
          for i in range(40)]
    assert sum(p < 0.01 for p in ps) <= 3
    assert min(ps) > 0  # never exactly zero


def test_a_speculation_bias_is_found():
    # The failure a wrong rejection sampler makes: the drafted token gains mass (p -> p + (1 - p) p).
    rng = np.random.default_rng(2)
    p = np.array([0.5, 0.3, 0.2])
    biased = p.copy()
    biased[0] = p[0] + (1 - p[0]) * p[0]
    biased[1:] *= (1 - biased[0]) / p[1:].sum()
    a = list(rng.choice(3, 1000, p=p))
    b = list(rng.choice(3, 1000, p=biased))
    assert categorical_homogeneity_test(a, b, permutations=500) < 0.01


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="at least one"):
        categorical_homogeneity_test([], ["x"])
    with pytest.raises(ValueError, match="permutations"):
        categorical_homogeneity_test(["x"], ["x"], permutations=0)
