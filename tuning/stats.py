"""Small-sample statistics for comparing configs: Student-t quantiles and mean confidence intervals.

Why here and hand-written: two numbers do not justify scipy as a dependency. The quantile is exact for
one and two degrees of freedom (closed forms) and within 1e-3 relative from three up (Abramowitz &
Stegun 26.7.5), which is what interleaved rounds of a benchmark give.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = ["mean_confidence_interval", "t_quantile"]


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p={p}; allowed: 0 < p < 1")
    if df < 1:
        raise ValueError(f"df={df}; allowed: >= 1")
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = statistics.NormalDist().inv_cdf(p)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def mean_confidence_interval(samples: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """``(mean, low, high)``: the two-sided ``level`` t-interval of the mean of ``samples``.

    One sample gives a zero-width interval at the sample: a figure measured once has no known spread,
    and callers that compare configs must ask for at least two rounds."""
    if not samples:
        raise ValueError("no samples")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level}; allowed: 0 < level < 1")
    mean = statistics.fmean(samples)
    if len(samples) == 1:
        return mean, mean, mean
    half = t_quantile(0.5 + level / 2, len(samples) - 1) * statistics.stdev(samples) / math.sqrt(len(samples))
    return mean, mean - half, mean + half
