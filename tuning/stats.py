"""Statistics for comparing configs: Student-t quantiles, mean confidence intervals, the noise of one
benchmark round and of one engine start pooled over a sweep (:class:`PooledNoise`), and a two-sample
test that two engines produce the same distribution of categorical outcomes.

Why here and hand-written: three functions do not justify scipy as a dependency. The quantile is exact
for one and two degrees of freedom (closed forms) and within 1e-3 relative from three up (Abramowitz &
Stegun 26.7.5), which is what interleaved rounds of a benchmark give. The homogeneity test is a
permutation test, so it needs no large-sample approximation: sampled completions spread over many rare
strings, where a chi-square table's expected counts are far below five.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["PooledNoise", "categorical_homogeneity_test", "chi2_quantile", "chi_square_statistic", "effective_starts",
           "mean_confidence_interval", "rounds_for_half_width", "sd_interval", "t_quantile"]


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


def chi2_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of chi-square with ``df`` degrees of freedom, by the Wilson-Hilferty normal
    approximation (within ~1 % from 3 df up; 0 where it would go below)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p={p}; allowed: 0 < p < 1")
    if df < 1:
        raise ValueError(f"df={df}; allowed: >= 1")
    k = 2.0 / (9.0 * df)
    return df * max(1.0 - k + statistics.NormalDist().inv_cdf(p) * math.sqrt(k), 0.0) ** 3


def sd_interval(sd: float, df: int, level: float = 0.95) -> tuple[float, float]:
    """The two-sided ``level`` interval of a standard deviation ``sd`` estimated with ``df`` degrees of freedom,
    ``sd * sqrt(df / chi2)`` at the chi-square quantiles (:func:`chi2_quantile`); a few pairs leave an sd
    uncertain by a factor of ~2. The upper end is infinite where the low quantile is 0."""
    low_q = chi2_quantile(0.5 - level / 2, df)
    return (sd * math.sqrt(df / chi2_quantile(0.5 + level / 2, df)),
            sd * math.sqrt(df / low_q) if low_q > 0 else math.inf)


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


def rounds_for_half_width(cv: float, half_width: float, level: float = 0.95, *, max_rounds: int = 10_000) -> int:
    """The fewest rounds (>= 2) whose ``level`` t-interval of the mean is at most ``±half_width`` (relative)
    when one round varies by ``cv`` (its standard deviation over the mean): what a measurement must cost
    before it can decide a relative bar. Raises where even ``max_rounds`` would not do."""
    if cv < 0 or half_width <= 0:
        raise ValueError(f"cv={cv}, half_width={half_width}; allowed: cv >= 0, half_width > 0")
    n = 2
    while t_quantile(0.5 + level / 2, n - 1) * cv / math.sqrt(n) > half_width:
        n += 1
        if n > max_rounds:
            raise ValueError(f"more than {max_rounds} rounds for ±{half_width:g} at {cv:g} per round")
    return n


def effective_starts(rounds_per_start: Sequence[int]) -> float:
    """How many engine starts a mean over all these rounds averages, for the variation between starts:
    ``N^2 / sum n_j^2``, the number of starts when they have equal rounds, fewer when one start holds most
    rounds (its luck weighs in the mean by its share of the rounds)."""
    if not rounds_per_start or min(rounds_per_start) < 1:
        raise ValueError(f"rounds_per_start={tuple(rounds_per_start)}; allowed: at least one start, each >= 1 round")
    total = sum(rounds_per_start)
    return total * total / sum(n * n for n in rounds_per_start)


@dataclass(frozen=True)
class PooledNoise:
    """How much one round's throughput moves, pooled over every config x cell a sweep measured in rounds:
    the standard deviation of log throughput about each engine start's own mean, with its degrees of
    freedom (rounds minus one, summed); and, where some config was measured on one cell by more than one
    engine start, how much a start shifts its rounds there (``start_sd``, with ``start_df`` degrees of
    freedom and ``start_rounds`` rounds a start, the pooled n0 of the layout).

    Why pooled: two or three rounds per measurement leave each one's own spread nearly unknown (two
    rounds give one degree of freedom, and a 95 % t-interval 12.7 standard errors wide), so comparing
    per-measurement intervals calls almost nothing different. The wave-to-wave noise is a property of
    the setup (engine, host, workload length), not of one cell: pooled over a sweep's measurements it is
    known to within a few percent, and a ratio of two configs on one cell gets an interval of useful
    width. Logs, because the noise is relative (a wave moves some percent, at any throughput).

    Why a second level: the rounds of one engine start share that start's luck (its memory layout, its
    compiled kernels, what the host did meanwhile), so their spread holds none of the variation between
    starts; more rounds on one start shrink only the first term of a comparison's variance. Where the
    sweep measured a config again on a fresh engine (``--decide-rounds``) the starts' means tell that
    variation apart (one-way random effects, method of moments, pooled over the measurements with
    several starts), and every comparison carries it: two configs measured on one start each differ by
    two starts' luck too. Without such measurements ``start_sd`` is 0 with ``start_df`` 0: unknown, and
    a difference called real can still be one start's luck.

    What it assumes: one spread for every cell (short outputs and one-wave cells move more than long
    ones, so pooling understates their noise and overstates the others'), and start offsets independent
    of the config. Whether one start shifts all its cells alike or each by its own amount, the estimate
    holds; its degrees of freedom are what the two differ in, and the caller says how many independent
    start contrasts there are (:meth:`of_starts`)."""

    sd: float
    df: int
    start_sd: float = 0.0
    start_df: int = 0
    start_rounds: float = 1.0

    @classmethod
    def of(cls, groups: Iterable[Sequence[float]]) -> PooledNoise | None:
        """From each measurement's rounds (throughputs > 0), every measurement its own engine start; ``None``
        when no measurement has two rounds."""
        return cls.of_starts([g] for g in groups)

    @classmethod
    def of_starts(cls, measurements: Iterable[Sequence[Sequence[float]]], *,
                  contrasts: int | None = None) -> PooledNoise | None:
        """From each measurement (one config on one cell) as its engine starts' rounds (throughputs > 0);
        ``None`` when no start has two rounds. The spread between starts, from the measurements with two
        starts or more: the starts' mean logs about the measurement's, weighted by their rounds (the
        between-start sum of squares, ``k - 1`` degrees of freedom for ``k`` starts), less what the rounds'
        own spread puts there, over ``n0 = (N - sum n_j^2 / N) / (k - 1)`` rounds a start (the unbalanced
        one-way layout's), clipped at 0. ``contrasts``: the independent start contrasts behind them when
        fewer than those degrees of freedom (one start measures several cells: if it shifts them all alike,
        a config's k starts give k - 1 however many cells they measured); it caps ``start_df``."""
        ss_w, df_w = 0.0, 0
        between: list[tuple[float, int, float]] = []  # (sum of squares, df, n0) per measurement with >= 2 starts
        for starts in measurements:
            logs = [[math.log(x) for x in rounds if x > 0] for rounds in starts]
            logs = [g for g in logs if g]
            for g in logs:
                if len(g) > 1:
                    m = statistics.fmean(g)
                    ss_w += sum((x - m) ** 2 for x in g)
                    df_w += len(g) - 1
            if len(logs) > 1:
                n = [len(g) for g in logs]
                total = sum(n)
                means = [statistics.fmean(g) for g in logs]
                grand = sum(nj * mj for nj, mj in zip(n, means)) / total
                n0 = (total - sum(nj * nj for nj in n) / total) / (len(n) - 1)
                between.append((sum(nj * (mj - grand) ** 2 for nj, mj in zip(n, means)), len(n) - 1, n0))
        if not df_w:
            return None
        sd2 = ss_w / df_w
        df_b = sum(df for _, df, _ in between)
        if not df_b:
            return cls(sd=math.sqrt(sd2), df=df_w)
        n0 = sum(df * n0 for _, df, n0 in between) / df_b
        excess = sum(ss for ss, _, _ in between) / df_b - sd2  # the between-start mean square less the rounds' part
        start_df = df_b if contrasts is None else max(1, min(df_b, contrasts))
        return cls(sd=math.sqrt(sd2), df=df_w, start_sd=math.sqrt(max(0.0, excess / n0)), start_df=start_df,
                   start_rounds=n0)

    def ratio_interval(self, a: Sequence[float], b: Sequence[float], level: float = 0.95, *,
                       starts: tuple[float, float] = (1.0, 1.0)) -> tuple[float, float, float]:
        """``(ratio, low, high)``: the geometric mean of ``a`` over that of ``b`` and its ``level`` interval.
        ``starts``: the engine starts behind each sample, as :func:`effective_starts` counts them; each
        adds ``start_sd^2 / starts`` to the variance of its mean log (degrees of freedom: :meth:`_df`)."""
        if not a or not b or min(*a, *b) <= 0:
            raise ValueError("both samples need at least one throughput, all > 0")
        if min(starts) < 1.0:
            raise ValueError(f"starts={starts}; allowed: >= 1 each")
        d = statistics.fmean(math.log(x) for x in a) - statistics.fmean(math.log(x) for x in b)
        return self._log_interval(d, (len(a), len(b)), level, starts)

    def ratio_bounds(self, ratio: float, rounds: tuple[float, float], level: float = 0.95, *,
                     starts: tuple[float, float] = (1.0, 1.0)) -> tuple[float, float, float]:
        """``(ratio, low, high)`` for a ratio of two figures already formed (a prediction built from several
        cells' means, say), each the mean of ``rounds`` rounds over ``starts`` engine starts: the interval
        :meth:`ratio_interval` gives two samples of those sizes with that ratio."""
        if ratio <= 0 or min(rounds) < 1 or min(starts) < 1.0:
            raise ValueError(f"ratio={ratio}, rounds={rounds}, starts={starts}; allowed: ratio > 0, rounds and starts >= 1")
        return self._log_interval(math.log(ratio), rounds, level, starts)

    def _log_interval(self, d: float, rounds: tuple[float, float], level: float,
                      starts: tuple[float, float]) -> tuple[float, float, float]:
        rounds_part = 1 / rounds[0] + 1 / rounds[1]
        starts_part = 1 / starts[0] + 1 / starts[1]
        var = self.sd ** 2 * rounds_part + self.start_sd ** 2 * starts_part
        half = t_quantile(0.5 + level / 2, self._df(rounds_part, starts_part)) * math.sqrt(var)
        return math.exp(d), math.exp(d - half), math.exp(d + half)

    def _df(self, rounds_part: float, starts_part: float) -> int:
        """Degrees of freedom of ``sd^2 rounds_part + start_sd^2 starts_part`` as estimated, at least 1:
        Satterthwaite's on the two mean squares it is made of, ``MS_W = sd^2`` and ``MS_B = sd^2 + n0
        start_sd^2``: the variance is ``(rounds_part - starts_part / n0) MS_W + (starts_part / n0) MS_B``.
        With equal rounds on every start the first coefficient is about 0 and the between-start mean square,
        with its few degrees of freedom, carries the comparison, as it should. Where the start variation
        was estimated at 0 (clipped) or not at all, the rounds' own."""
        if self.start_sd <= 0.0 or not self.start_df:
            return self.df
        ms_w, ms_b = self.sd ** 2, self.sd ** 2 + self.start_rounds * self.start_sd ** 2
        c_b = starts_part / self.start_rounds
        c_w = rounds_part - c_b
        var = c_w * ms_w + c_b * ms_b
        return max(1, math.floor(var ** 2 / ((c_w * ms_w) ** 2 / self.df + (c_b * ms_b) ** 2 / self.start_df)))

    def different(self, a: Sequence[float], b: Sequence[float], level: float = 0.95, *,
                  starts: tuple[float, float] = (1.0, 1.0)) -> bool:
        """Is one sample's throughput shown above the other's: does the ratio's interval exclude 1?"""
        _, low, high = self.ratio_interval(a, b, level, starts=starts)
        return low > 1.0 or high < 1.0

    def rounds_to_separate(self, ratio: float, level: float = 0.95, power: float = 0.8, *,
                           max_rounds: int = 1000, starts: float = 1.0) -> int | None:
        """The fewest rounds per config (both configs alike, at least two, spread over ``starts`` engine
        starts each) at which a true throughput ``ratio`` of one config over the other would be shown
        different from 1 (:meth:`different` at ``level``) with probability ``power``: the smallest ``n``
        with ``|log ratio| >= (t(level) + t(power)) * sqrt(2 sd^2 / n + 2 start_sd^2 / starts)``, both
        quantiles at the degrees of freedom :meth:`ratio_interval` would use (the new rounds would add some,
        so this errs on the side of more rounds). ``None`` for a ratio of 1 (no gap to find) or where more
        than ``max_rounds`` would be needed, which the variation between starts makes so at any number of
        rounds when the gap is within its share.

        Why: a comparison within noise means "not shown", not "the same". At a log sd of 0.11 pooled
        over 8 df, two rounds a config give a 95 % ratio interval of 0.78-1.29 times
        the measured ratio, wide enough to hide a 0.8x gap; a sweep that keeps a cell on the primary for
        that reason should say what it would cost to find out, not leave the next sweep to commit another
        table by luck."""
        if not 0.0 < ratio < math.inf:
            raise ValueError(f"ratio={ratio}; allowed: a throughput ratio > 0")
        if not 0.0 < level < 1.0:
            raise ValueError(f"level={level}; allowed: 0 < level < 1")
        if not 0.0 < power < 1.0:
            raise ValueError(f"power={power}; allowed: 0 < power < 1")
        if max_rounds < 2:
            raise ValueError(f"max_rounds={max_rounds}; allowed: >= 2")
        if starts < 1.0:
            raise ValueError(f"starts={starts}; allowed: >= 1")
        gap = abs(math.log(ratio))
        if gap == 0.0:
            return None
        starts_part = 2 / starts

        def separates(n: int) -> bool:
            df = self._df(2 / n, starts_part)
            k = t_quantile(0.5 + level / 2, df) + t_quantile(power, df)
            return gap >= k * math.sqrt(self.sd ** 2 * 2 / n + self.start_sd ** 2 * starts_part)

        if not self.start_sd:  # monotone in n: bisect
            if not separates(max_rounds):
                return None
            lo, hi = 1, max_rounds
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if separates(mid) else (mid, hi)
            return max(2, hi)
        # with start variation the degrees of freedom move with n, and not always one way: the first n that does
        return next((n for n in range(2, max_rounds + 1) if separates(n)), None)

    def describe(self) -> str:
        said = f"one round's throughput moves {math.expm1(self.sd):.1%} (log sd {self.sd:.3f}, {self.df} df, pooled)"
        if self.start_df and self.start_sd > 0:
            said += (f"; an engine start shifts its rounds by {math.expm1(self.start_sd):.1%} (log sd "
                     f"{self.start_sd:.3f}, {self.start_df} df)")
        elif self.start_df:
            said += f"; engine starts apart by no more than their rounds' own spread ({self.start_df} df)"
        return said


def chi_square_statistic(a: Sequence[Hashable], b: Sequence[Hashable]) -> float:
    """Pearson's chi-square statistic of the 2 x K table of outcome counts of samples ``a`` and ``b``."""
    codes, n_a = _codes(a, b)
    return _chi_square(codes, n_a, int(codes.max()) + 1)


def categorical_homogeneity_test(a: Sequence[Hashable], b: Sequence[Hashable], *, permutations: int = 2000,
                                 seed: int = 0) -> float:
    """p-value of "``a`` and ``b`` are samples of one categorical distribution" (two-sided).

    The statistic is Pearson's chi-square of the 2 x K count table; its null distribution comes from
    ``permutations`` random relabellings of the pooled outcomes, so the p-value is exact up to Monte
    Carlo error whatever the counts (``(1 + #{null >= observed}) / (1 + permutations)``, never 0). An
    engine whose speculation changed what it samples differs from the plain engine in some category;
    this finds it without knowing which."""
    if not a or not b:
        raise ValueError("both samples need at least one outcome")
    if permutations < 1:
        raise ValueError(f"permutations={permutations}; allowed: >= 1")
    codes, n_a = _codes(a, b)
    k = int(codes.max()) + 1
    observed = _chi_square(codes, n_a, k)
    rng = np.random.default_rng(seed)
    exceed = 0
    for _ in range(permutations):
        if _chi_square(rng.permutation(codes), n_a, k) >= observed - 1e-9:
            exceed += 1
    return (1 + exceed) / (1 + permutations)


def _codes(a: Sequence[Hashable], b: Sequence[Hashable]) -> tuple[np.ndarray, int]:
    index: dict[Hashable, int] = {}
    codes = np.fromiter((index.setdefault(x, len(index)) for x in (*a, *b)), dtype=np.int64,
                        count=len(a) + len(b))
    return codes, len(a)


def _chi_square(codes: np.ndarray, n_a: int, k: int) -> float:
    count_a = np.bincount(codes[:n_a], minlength=k).astype(float)
    total = np.bincount(codes, minlength=k).astype(float)
    n = float(len(codes))
    expected_a = total * (n_a / n)
    expected_b = total - expected_a
    count_b = total - count_a
    return float((((count_a - expected_a) ** 2) / expected_a).sum() + (((count_b - expected_b) ** 2) / expected_b).sum())
