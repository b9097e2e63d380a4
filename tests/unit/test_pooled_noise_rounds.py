"""The rounds per config a sweep would need to show a throughput gap of a given size at its pooled noise
(:meth:`tuning.stats.PooledNoise.rounds_to_separate`): a within-noise call is "not shown", and this says
what showing it would cost."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tuning.stats import PooledNoise, t_quantile


def _margin(noise: PooledNoise, ratio: float, n: int, level: float = 0.95, power: float = 0.8) -> float:
    """``|log ratio|`` less what ``n`` rounds a config need: >= 0 where ``n`` separates the ratio."""
    k = t_quantile(0.5 + level / 2, noise.df) + t_quantile(power, noise.df)
    return abs(math.log(ratio)) - k * noise.sd * math.sqrt(2 / n)


@pytest.mark.parametrize("sd, df, ratio", [(0.11, 8, 0.8), (0.11, 8, 1.06), (0.05, 40, 1.1), (0.2, 3, 0.5),
                                           (0.03, 100, 1.02), (0.15, 12, 1.3)])
def test_the_rounds_are_the_fewest_that_separate_the_ratio(sd, df, ratio):
    noise = PooledNoise(sd, df)
    n = noise.rounds_to_separate(ratio)
    assert n is not None and n >= 2
    assert _margin(noise, ratio, n) >= 0
    assert n == 2 or _margin(noise, ratio, n - 1) < 0


def test_an_illustrative_case():
    """Log sd 0.11 over 8 df: a true 0.8x gap needs 5 rounds a config, not the sweep's 2; the measured 1.06x
    would need 73 (2 x ((2.306 + 0.889) x 0.11 / 0.0583)^2 = 72.7)."""
    noise = PooledNoise(0.11, 8)
    assert noise.rounds_to_separate(0.8) == 5
    assert noise.rounds_to_separate(1.06) == 73
    assert noise.rounds_to_separate(1.06, power=0.5) < 73 < noise.rounds_to_separate(1.06, power=0.9)
    assert noise.rounds_to_separate(1.06, level=0.9) < 73


def test_a_gap_wide_enough_needs_the_fewest_rounds_and_no_noise_needs_no_more():
    assert PooledNoise(0.11, 8).rounds_to_separate(3.0) == 2
    assert PooledNoise(0.0, 8).rounds_to_separate(1.001) == 2


@pytest.mark.parametrize("sd, df, ratio", [(0.11, 8, 0.8), (0.05, 40, 1.1), (0.2, 3, 1.7), (0.03, 100, 1.02)])
def test_a_gap_and_its_inverse_need_the_same_rounds(sd, df, ratio):
    noise = PooledNoise(sd, df)
    assert noise.rounds_to_separate(ratio) == noise.rounds_to_separate(1 / ratio)


def test_no_gap_and_gaps_too_small_to_afford_give_none():
    noise = PooledNoise(0.11, 8)
    assert noise.rounds_to_separate(1.0) is None
    assert noise.rounds_to_separate(1.001) is None  # ~250,000 rounds
    assert noise.rounds_to_separate(1.001, max_rounds=10**7) is not None
    n = noise.rounds_to_separate(1.06)
    assert noise.rounds_to_separate(1.06, max_rounds=n) == n
    assert noise.rounds_to_separate(1.06, max_rounds=n - 1) is None


@pytest.mark.parametrize("kwargs, match", [
    ({"ratio": 0.0}, "ratio"), ({"ratio": -1.2}, "ratio"), ({"ratio": math.nan}, "ratio"),
    ({"ratio": math.inf}, "ratio"),
    ({"ratio": 1.1, "level": 0.0}, "level"), ({"ratio": 1.1, "level": 1.0}, "level"),
    ({"ratio": 1.1, "power": 0.0}, "power"), ({"ratio": 1.1, "power": 1.0}, "power"),
    ({"ratio": 1.1, "max_rounds": 1}, "max_rounds"),
])
def test_bad_inputs_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PooledNoise(0.1, 10).rounds_to_separate(**kwargs)


@pytest.mark.parametrize("sd, n", [(0.1, 6), (0.12, 3)])
def test_at_those_rounds_the_gap_is_shown_with_about_that_power(sd, n):
    """Simulated sweeps: ``n`` log-normal rounds of each config at a true ratio set so that ``n`` is exactly
    what it needs, with the noise's sd known to within 40 df. :meth:`PooledNoise.different` should call them
    different about 80 % of the time; one round fewer, less often."""
    df = 40
    k = t_quantile(0.975, df) + t_quantile(0.8, df)
    ratio = math.exp(k * sd * math.sqrt(2 / n) * (1 + 1e-9))
    noise = PooledNoise(sd, df)
    assert noise.rounds_to_separate(ratio) == n
    rng = np.random.default_rng(20261204)

    def shown(rounds: int, trials: int = 4000) -> float:
        a = np.exp(rng.normal(math.log(ratio), sd, size=(trials, rounds)))
        b = np.exp(rng.normal(0.0, sd, size=(trials, rounds)))
        return sum(noise.different(list(x), list(y)) for x, y in zip(a, b)) / trials

    assert shown(n) == pytest.approx(0.8, abs=0.07)
    assert shown(n - 1) < 0.76  # 0.73 and 0.64 expected: n is the fewest that reach 0.8
