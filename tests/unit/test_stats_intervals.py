"""The chi-square quantile and the interval of a standard deviation that the noise write-ups use."""
from __future__ import annotations

import math

import pytest

from tuning.stats import chi2_quantile, sd_interval


def test_chi2_quantiles_match_the_tables():
    assert chi2_quantile(0.975, 10) == pytest.approx(20.483, rel=0.01)  # tabled: 20.483
    assert chi2_quantile(0.025, 10) == pytest.approx(3.247, rel=0.01)   # tabled: 3.247
    assert chi2_quantile(0.5, 100) == pytest.approx(99.33, rel=0.001)   # tabled: 99.334
    assert chi2_quantile(0.025, 1) == 0.0  # the approximation goes below 0 there: clamped
    for bad in ((0.0, 5), (1.0, 5), (0.5, 0)):
        with pytest.raises(ValueError):
            chi2_quantile(*bad)


def test_an_sd_from_few_degrees_of_freedom_is_known_to_a_factor_of_two():
    lo, hi = sd_interval(0.1, 5)
    assert lo == pytest.approx(0.1 * math.sqrt(5 / 12.833), rel=0.01)  # tabled chi2(0.975, 5) = 12.833
    assert hi == pytest.approx(0.1 * math.sqrt(5 / 0.831), rel=0.03)   # tabled 0.831; Wilson-Hilferty 0.798 (4 %)
    assert hi / 0.1 > 2
    assert sd_interval(0.1, 1)[1] == math.inf
    narrow = sd_interval(0.1, 1000)
    assert narrow[0] > 0.095 and narrow[1] < 0.105
