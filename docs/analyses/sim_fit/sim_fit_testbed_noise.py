"""How much of the MoE-testbed simulator fit's held-out error is measurement noise, and how much is the model's
own? An analysis of committed GPU measurements (one closed-loop run per cell) against the committed fit's
SIMULATED figures; nothing runs on a GPU or in the simulator here.

Why: ``sim_fit_testbed_2026-12-04.md`` put the held-out log-RMS error (0.15) against one run's noise measured on
five warm repeats of MTP off, output 512 (0.091), and read the remainder (~12 %) as the model's own error. That
assumes every cell moves as much as those five. It does not: output-128 runs last 1-3 s and move much more.
This script measures the noise by cell type from the landscape itself and redoes the decomposition with it.

Three sources of noise, weakest to strongest assumption:

1. *Direct repeats*: the 15 MTP-off cells measured in two leases (``superseded`` keeps the earlier run). Few,
   all MTP off, and only output-512 greedy was warm both times (:data:`WARM_REPEAT_PREFIXES`).
2. *Near-repeats across agreement levels*: each MTP engine config (draft count, output length, temperature,
   concurrency) was measured at three agreement levels (0.7, 0.9, 0.5), one level per lease. The simulator's
   step constants are shared by the levels (acceptance is fitted per level), so the difference of two levels'
   log errors ``log(sim/meas)`` cancels the misfit the levels share and leaves the two runs' noise plus
   whatever misfit differs between levels: an upper bound on noise. From the two warm leases (0.9 − 0.5) the
   one-run sd per output length is ``sqrt(var(d) / 2)``; from all three leases jointly, a likelihood over each
   config's two contrasts (:func:`fit_lease_noise`) with a per-output sd, an extra variance for lease 1 (no
   per-concurrency warm-up; also the only a0.7 lease, so the extra holds a0.7-only misfit too) and a mean shift
   per lease. Intervals: the envelope of two bootstraps, over configs and over engine passes
   (:data:`BOOTSTRAP_UNITS`), since configs of one engine start are not independent.
3. *Held-out decomposition*: with those per-type noise variances, each held-out group's errors are compared with
   what an exact-in-expectation model would give (passes, mean, chi-square) and the model's own error is the
   maximum-likelihood sd ``m`` in ``e ~ N(0, noise^2 + m^2)``, with a bootstrap interval that refits the noise
   per resample (the noise sd is known only to ~±20 %). Raw first; then, as a sensitivity check, with a
   level/protocol offset removed per (lease, MTP on/off): the mean log error of that lease's FIT cells of the
   same kind. Not a clean lease effect: each MTP agreement level is one lease, and lease 1 alone ran without
   per-concurrency warm-up, so an offset mixes lease, level and protocol (see the write-up's caveats).

    python -m docs.analyses.sim_fit.sim_fit_testbed_noise                       # writes docs/analyses/sim_fit/sim_fit_testbed_noise_<date>.md/.json
    python -m docs.analyses.sim_fit.sim_fit_testbed_noise --bootstrap 200 --name scratch_noise

Last, how many runs per cell would make the ±10 % bar decidable cell by cell (:func:`decidability`).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from orchestrator.hostinfo import git_commit
from tuning.simfit import (
    THROUGHPUT_TOLERANCE,
    WARM_REPEAT_PREFIXES,
    RepeatPair,
    repeat_noise,
    repeat_pairs,
)
from tuning.stats import sd_interval

ROOT = Path(__file__).resolve().parents[3]

DEFAULT_LANDSCAPE = Path("benchmarks/results/gpu_landscape_h200_2026-12-04_a0.5/landscape.json")
DEFAULT_FIT = Path("docs/analyses/sim_fit/sim_fit_testbed_2026-12-04.json")
TOLERANCE = THROUGHPUT_TOLERANCE
"""The fit's per-cell bar: |sim / measured - 1| <= 10 % (checked against the fit's ``tolerances`` at load)."""
TYPE_BAR = 0.05
"""The proposed bar for a cell type's mean error: its 95 % interval inside ±5 %."""
LEVEL = 0.95

AGREEMENT_LEASE = {0.7: 1, 0.9: 2, 0.5: 3}
"""Which lease measured each agreement level's MTP engines, read off the landscape's ``commands``: lease 1 ran
``--agreements 0.7,0.9,0.5`` and got through MTP off and 0.7; lease 2 ran ``--agreements 0.9,0.5,0.7 --redo
'mtp-off|out128|T0|'`` (then ``--redo 'mtp-off|out512|T0|'``) and got through 0.9; lease 3 ran ``--agreements
0.9,0.5,0.7 --redo 'mtp-off|out128|T0.8|'`` and measured 0.5. The short ``--agreements 0.7 --draft-tokens 4`` and
``--agreements 0.5 --draft-tokens 4`` calls are taken as part of leases 1 and 3 (the file records no times to
check that by). Only lease 1 ran before the per-concurrency warm-up existed, so its cells alone lack the
``warmup`` field; :func:`check_leases` holds the tables to that at load."""
REDO_LEASE = {"mtp-off|out128|T0|": 2, "mtp-off|out512|T0|": 2, "mtp-off|out128|T0.8|": 3}
"""MTP-off cells measured again (``--redo``) and the lease whose run is the current figure; the other MTP-off
cells (output 512, T 0.8) keep lease 1's run."""
REPEAT_GROUPS = {
    "mtp-off|out512|T0|": "o512 T0: lease 1's third pass over the engine vs lease 2",
    "mtp-off|out128|T0.8|": "o128 T0.8: lease 1's second pass vs lease 3 (warm)",
    "mtp-off|out128|T0|": "o128 T0: lease 1's first pass on a fresh engine (start-up cost) vs lease 2 (warm)",
}
LEVELS = tuple(sorted(AGREEMENT_LEASE, key=AGREEMENT_LEASE.__getitem__))
"""The agreement levels in lease order: the columns of :func:`level_errors` (column i is lease i + 1)."""
LEVEL_PAIRS = ((0.9, 0.5), (0.7, 0.5), (0.7, 0.9))


class NoiseError(Exception):
    """The inputs do not fit together (a landscape cell with no fit record, a config missing a level)."""


# ----------------------------------------------------------------------------------------------- cells

@dataclass(frozen=True)
class Cell:
    """One landscape cell beside the committed fit's figures for it."""

    key: str
    name: str
    engine: str
    draft_tokens: int
    agreement: float | None
    output_len: int
    concurrency: int
    temperature: float
    lease: int
    held_out: bool
    measured: float
    simulated: float
    duration_s: float

    @property
    def log_error(self) -> float:
        """``log(sim / measured)``: relative, symmetric, and what the fit's log-RMS is made of."""
        return math.log(self.simulated / self.measured)

    @property
    def passes(self) -> bool:
        """The fit's per-cell bar, on the raw error."""
        return abs(self.simulated / self.measured - 1.0) <= TOLERANCE


def lease_of(key: str, cell: Mapping[str, Any]) -> int:
    """The lease (1, 2, 3) whose run is the cell's current figure (:data:`AGREEMENT_LEASE`, :data:`REDO_LEASE`).
    Why it matters: a lease shifts all its cells together (engine start, host state), and lease 1 ran without
    the per-concurrency warm-up the later leases had."""
    if cell.get("agreement") is not None:
        return AGREEMENT_LEASE[round(float(cell["agreement"]), 3)]
    for prefix, lease in REDO_LEASE.items():
        if key.startswith(prefix):
            return lease
    return 1


def check_leases(landscape: Mapping[str, Any]) -> None:
    """The hard-coded lease tables against the landscape's own record: the ``warmup`` field must be absent exactly
    on the cells :func:`lease_of` puts in lease 1 (the lease before the per-concurrency warm-up existed). A later
    ``--redo`` of lease-1 cells (e.g. ``--redo 'a0.7-'``) would break this, and the tables must then be redone."""
    wrong = sorted(k for k, c in landscape["cells"].items() if (lease_of(k, c) == 1) != (c.get("warmup") is None))
    if wrong:
        raise NoiseError(f"{len(wrong)} cells' lease does not match their warm-up record (lease 1 = no 'warmup' field), "
                         f"e.g. {wrong[:3]}; the landscape was measured again since AGREEMENT_LEASE / REDO_LEASE "
                         "were written: update them")


def check_fit_of(fit: Mapping[str, Any], landscape_path: Path | str) -> None:
    """The fit JSON must name the landscape passed among its ``measurements`` (paths relative to the checkout),
    and judge cells by the same ±10 % as :data:`TOLERANCE`."""
    def norm(x: Path | str) -> Path:
        x = Path(x)
        return (x if x.is_absolute() else ROOT / x).resolve()
    named = [norm(m) for m in fit.get("measurements") or []]
    if norm(landscape_path) not in named:
        raise NoiseError(f"the fit's measurements {fit.get('measurements')} do not name {landscape_path}")
    tol = (fit.get("tolerances") or {}).get("throughput")
    if tol is not None and not math.isclose(float(tol), TOLERANCE):
        raise NoiseError(f"the fit judged cells by ±{tol}, this script by ±{TOLERANCE}")


def fit_cell_name(cell: Mapping[str, Any]) -> str:
    """The fit's name for a landscape cell (``engine oN cC TT nR``, as ``tuning.simfit`` names cells)."""
    requests = int(cell["completed"]) + int(cell.get("failed") or 0)
    return (f"{cell['engine']} o{int(cell['output_len'])} c{int(cell['concurrency'])} "
            f"T{float(cell['temperature']):g} n{requests}")


def join_cells(landscape: Mapping[str, Any], fit: Mapping[str, Any], landscape_path: Path | str | None = None) -> list[Cell]:
    """Every landscape cell with the fit's measured and SIMULATED throughput and its split. Checks the leases
    against the warm-up record (:func:`check_leases`) and, given the landscape's path, that the fit is of it
    (:func:`check_fit_of`)."""
    check_leases(landscape)
    if landscape_path is not None:
        check_fit_of(fit, landscape_path)
    records = {r["cell"]: r for r in list(fit.get("held_out") or []) + list(fit.get("fit") or [])}
    out = []
    for key, c in sorted(landscape["cells"].items()):
        name = fit_cell_name(c)
        r = records.get(name)
        if r is None:
            raise NoiseError(f"landscape cell {key!r} ({name}) has no record in the fit; is it the fit of this landscape?")
        out.append(Cell(key=key, name=name, engine=str(c["engine"]), draft_tokens=int(c["draft_tokens"]),
                        agreement=None if c.get("agreement") is None else float(c["agreement"]),
                        output_len=int(c["output_len"]), concurrency=int(c["concurrency"]),
                        temperature=float(c["temperature"]), lease=lease_of(key, c), held_out=bool(r["held_out"]),
                        measured=float(r["measured_throughput"]), simulated=float(r["sim_throughput"]),
                        duration_s=float(c["duration_s"])))
    return out


# ----------------------------------------------------------------------------------------------- statistics

def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-14:
            break
    return h


def regularized_beta(a: float, b: float, x: float) -> float:
    """``I_x(a, b)``; what Student's t tail is made of (scipy not being a dependency)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: int) -> float:
    """Two-sided p of Student's t statistic ``t`` with ``df`` degrees of freedom (exact, via ``I_x(df/2, 1/2)``)."""
    if df < 1:
        return float("nan")
    return regularized_beta(df / 2.0, 0.5, df / (df + t * t))


def t_critical(level: float, df: int) -> float:
    """The two-sided ``level`` critical value of Student's t, by inverting :func:`t_two_sided_p` (bisection), so
    an interval and a p-value come from the same CDF: the interval excludes 0 exactly when ``p < 1 - level``."""
    if df < 1:
        return float("nan")
    target, lo, hi = 1.0 - level, 0.0, 1.0
    while t_two_sided_p(hi, df) > target:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_two_sided_p(mid, df) > target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return (lo + hi) / 2.0


def f_sf(f: float, d1: int, d2: int) -> float:
    """Upper tail of Snedecor's F on (``d1``, ``d2``) degrees of freedom (exact, ``I_x(d2/2, d1/2)``)."""
    return regularized_beta(d2 / 2.0, d1 / 2.0, d2 / (d2 + d1 * max(f, 0.0)))


def chi2_sf(x: float, df: int) -> float:
    """Upper tail of chi-square, Wilson-Hilferty normal approximation (within ~0.01 in p from a few df up)."""
    if df < 1:
        return float("nan")
    k = 2.0 / (9.0 * df)
    return 1.0 - NormalDist().cdf(((max(x, 0.0) / df) ** (1.0 / 3.0) - (1.0 - k)) / math.sqrt(k))


def golden_min(f: Callable[[float], float], lo: float, hi: float, *, tol: float = 1e-6, grid: int = 0) -> float:
    """Minimise a 1-D function on ``[lo, hi]`` by golden section; with ``grid`` > 0 a coarse grid first picks
    the bracket, so one of several local minima cannot capture the search."""
    if grid:
        xs = [lo + (hi - lo) * i / grid for i in range(grid + 1)]
        i = min(range(len(xs)), key=lambda j: f(xs[j]))
        lo, hi = xs[max(i - 1, 0)], xs[min(i + 1, grid)]
    g = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    while b - a > tol:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    x = (a + b) / 2.0
    return min((lo, hi, x), key=f)


# ----------------------------------------------------------------------------------------------- direct repeats

def _pair_record(p: RepeatPair) -> dict[str, Any]:
    """A repeat pair for the record: key, log(current / earlier) and the two runs' seconds."""
    return {"key": p.key, "log_ratio": p.log_ratio, "earlier_s": p.run_s[0], "later_s": p.run_s[1]}


def one_run_sd(diffs: Sequence[float], *, centre: bool) -> float:
    """One run's sd from differences of two runs of the same thing: ``sqrt(sum(d - m)^2 / (n - c) / 2)``; ``centre``
    removes the mean difference (a shift between the two leases is then not counted as noise, and costs a df)."""
    d = np.asarray(diffs, dtype=float)
    if centre:
        return float(math.sqrt(np.var(d, ddof=1) / 2.0)) if d.size > 1 else float("nan")
    return float(math.sqrt(np.mean(d * d) / 2.0)) if d.size else float("nan")


def direct_repeats(landscape: Mapping[str, Any]) -> dict[str, Any]:
    """The repeat pairs (``tuning.simfit.repeat_pairs``) by group (:data:`REPEAT_GROUPS`): each pair, each group's
    mean log ratio and one-run sd (raw, ``tuning.simfit.repeat_noise``: a lease shift counted as noise, as the
    earlier write-up did; centred: shift removed)."""
    used, other = repeat_pairs(landscape)
    pairs = used + other
    groups = []
    for prefix, label in REPEAT_GROUPS.items():
        mine = sorted((p for p in pairs if p.key.startswith(prefix)), key=lambda p: int(p.key.rsplit("|c", 1)[-1]))
        if not mine:
            continue
        d = [p.log_ratio for p in mine]
        pooled = repeat_noise(mine)
        groups.append({"prefix": prefix, "label": label, "warm": prefix in WARM_REPEAT_PREFIXES,
                       "pairs": [_pair_record(p) for p in mine], "mean_log_ratio": statistics.fmean(d),
                       "sd_raw": pooled.sd, "sd_raw_interval": sd_interval(pooled.sd, pooled.df),
                       "sd_centred": one_run_sd(d, centre=True)})
    return {"pairs": len(pairs), "groups": groups,
            "other_pairs": [_pair_record(p) for p in pairs if not any(p.key.startswith(q) for q in REPEAT_GROUPS)]}


# ----------------------------------------------------------------------------------------------- near-repeats

def level_errors(cells: Sequence[Cell], levels: Sequence[float] = LEVELS
                 ) -> tuple[list[tuple[int, int, float, int]], np.ndarray]:
    """(configs, E): each MTP engine config (draft count, output length, temperature, concurrency) and its log
    errors at ``levels`` (one column per level; with :data:`LEVELS`, column i is lease i + 1). Raises where a
    config lacks a level."""
    by = {(c.agreement, c.draft_tokens, c.output_len, c.temperature, c.concurrency): c.log_error
          for c in cells if c.draft_tokens > 0 and c.agreement is not None}
    configs = sorted({k[1:] for k in by})
    missing = [(a,) + k for k in configs for a in levels if (a,) + k not in by]
    if missing:
        raise NoiseError(f"configs missing an agreement level: {missing[:3]}...")
    return configs, np.array([[by[(a,) + k] for a in levels] for k in configs])


def two_level_sd(e_a: np.ndarray, e_b: np.ndarray, types: np.ndarray) -> dict[Hashable, float]:
    """One run's sd per type from two levels' log errors of the same configs: the difference cancels what the
    model gets wrong for both and leaves two runs' noise (plus any misfit the levels do not share), centred
    (the two leases' shift removed)."""
    d = np.asarray(e_a) - np.asarray(e_b)
    return {t.item() if hasattr(t, "item") else t: one_run_sd(d[types == t], centre=True) for t in np.unique(types)}


@dataclass(frozen=True)
class LeaseNoise:
    """One run's sd per cell type (its lease shift removed), lease 1's extra sd, and the lease shifts
    (lease 1 - lease 3, lease 2 - lease 3) that the contrasts' means took up."""

    sd: dict[Hashable, float]
    lease1_extra: float
    shifts: tuple[float, float]
    nll: float

    def variance(self, kind: Hashable, lease: int) -> float:
        """A one-run measurement's noise variance."""
        return self.sd[kind] ** 2 + (self.lease1_extra ** 2 if lease == 1 else 0.0)


ContrastStats = dict[Hashable, tuple[int, float, float, float, float, float]]


def _contrast_stats(E: np.ndarray, types: np.ndarray) -> ContrastStats:
    """Per type, the sufficient statistics of the contrasts of ``E``'s columns (leases in order, :data:`LEVELS`)
    against its last (lease 1 - lease 3, lease 2 - lease 3): n, their sums and their cross-products (11, 12, 22)."""
    if E.shape[1] != 3:
        raise NoiseError(f"the contrast likelihood is written for three leases, not {E.shape[1]}")
    D = E[:, :-1] - E[:, -1:]
    out = {}
    for t in np.unique(types):
        Dt = D[types == t]
        out[t.item() if hasattr(t, "item") else t] = (
            len(Dt), float(Dt[:, 0].sum()), float(Dt[:, 1].sum()),
            float(Dt[:, 0] @ Dt[:, 0]), float(Dt[:, 0] @ Dt[:, 1]), float(Dt[:, 1] @ Dt[:, 1]))
    return out


def _lease_nll(sd: Mapping[Hashable, float], extra: float, stats: ContrastStats) -> tuple[float, tuple[float, float]]:
    """Negative log likelihood of the contrasts, the mean shifts profiled out (generalised least squares).
    A type's contrast covariance is [[2 s^2 + x^2, s^2], [s^2, 2 s^2]] (lease 3's run is in both contrasts).
    Written out for 2 x 2 in plain floats: the bootstrap calls it some million times."""
    A11 = A12 = A22 = b1 = b2 = 0.0
    parts = []
    for t, (n, s1, s2, m11, m12, m22) in stats.items():
        v = sd[t] ** 2
        a, c, d = 2 * v + extra ** 2, v, 2 * v
        det = a * d - c * c
        i11, i12, i22 = d / det, -c / det, a / det
        A11 += n * i11
        A12 += n * i12
        A22 += n * i22
        b1 += i11 * s1 + i12 * s2
        b2 += i12 * s1 + i22 * s2
        parts.append((n, s1, s2, m11, m12, m22, i11, i12, i22, det))
    detA = A11 * A22 - A12 * A12
    mu1, mu2 = (A22 * b1 - A12 * b2) / detA, (A11 * b2 - A12 * b1) / detA
    nll = 0.0
    for n, s1, s2, m11, m12, m22, i11, i12, i22, det in parts:
        q11 = m11 - 2 * s1 * mu1 + n * mu1 * mu1
        q12 = m12 - s1 * mu2 - s2 * mu1 + n * mu1 * mu2
        q22 = m22 - 2 * s2 * mu2 + n * mu2 * mu2
        nll += 0.5 * (n * math.log(det) + i11 * q11 + 2 * i12 * q12 + i22 * q22 + 2 * n * math.log(2 * math.pi))
    return nll, (mu1, mu2)


def fit_lease_noise(E: np.ndarray, types: np.ndarray, *, bound: float = 0.6, sweeps: int = 60) -> LeaseNoise:
    """Maximum likelihood of one run's sd per type and lease 1's extra sd from the three leases' log errors of
    the same configs (``E``: rows configs, columns leases 1, 2, 3). Each config's own misfit ``mu_k`` drops out
    of its two contrasts (restricted likelihood); a mean shift per lease stays in. Why contrasts, not the
    three pairwise differences: those share runs (each run is in two of them), so a likelihood that treats the
    240 differences as independent counts every run twice; the point estimates agree, its curvature does not.
    Coordinate-wise golden section over ``[1e-4, bound]``, repeated until nothing moves."""
    stats = _contrast_stats(np.asarray(E, dtype=float), np.asarray(types))
    names = list(stats)
    x = {t: 0.1 for t in names}
    extra = 0.05

    def f(sd: Mapping[Hashable, float], ex: float) -> float:
        return _lease_nll(sd, ex, stats)[0]

    for _ in range(sweeps):
        before = dict(x), extra
        for t in names:
            x[t] = golden_min(lambda v, t=t, ex=extra: f({**x, t: v}, ex), 1e-4, bound, tol=1e-6)
        extra = golden_min(lambda v, sd=dict(x): f(sd, v), 0.0, bound, tol=1e-6)
        if max([abs(x[t] - before[0][t]) for t in names] + [abs(extra - before[1])]) < 1e-6:
            break
    nll, m = _lease_nll(x, extra, stats)
    return LeaseNoise(sd=dict(x), lease1_extra=extra, shifts=(float(m[0]), float(m[1])), nll=nll)


def bootstrap(fn: Callable[[np.ndarray], Sequence[float]], types: np.ndarray, units: np.ndarray, reps: int,
              rng: np.random.Generator) -> np.ndarray:
    """``fn`` over ``reps`` resamples of the rows (configs): whole ``units`` (rows that share a unit label) drawn
    with replacement within each type, so rows that share an engine pass stay together and, units being of one
    size within a type, every type keeps its count."""
    strata = []
    for t in np.unique(types):
        labels = np.unique(units[types == t])
        strata.append([np.flatnonzero((types == t) & (units == u)) for u in labels])
    out = []
    for _ in range(reps):
        idx = np.concatenate([s[j] for s in strata for j in rng.integers(0, len(s), len(s))])
        out.append(list(fn(idx)))
    return np.array(out)


def engine_pass(config: tuple[int, int, float, int]) -> str:
    """The bootstrap unit of an MTP config: its engine's pass over one (output length, temperature), as a label.
    ``measure_landscape.py`` starts one engine per draft count per agreement level (so per lease) and measures
    output length x temperature x concurrency in that order; the five concurrencies of one pass share the
    engine start and the minutes they ran in."""
    draft, output_len, temperature, _ = config
    return f"mtp{draft} o{output_len} T{temperature:g}"


def _ci(v: np.ndarray) -> list[float]:
    return [float(np.percentile(v, 100 * (0.5 - LEVEL / 2))), float(np.percentile(v, 100 * (0.5 + LEVEL / 2)))]


def envelope(intervals: Sequence[Sequence[float]]) -> list[float]:
    """The widest reach of several intervals of one figure: the lowest low, the highest high."""
    return [min(i[0] for i in intervals), max(i[1] for i in intervals)]


BOOTSTRAP_UNITS: dict[str, Callable[[tuple[int, int, float, int]], str]] = {
    "configs": lambda k: f"mtp{k[0]} o{k[1]} T{k[2]:g} c{k[3]}",
    "engine passes": engine_pass,
}
"""The two bootstraps every interval of the near-repeats comes from; the write-up gives their envelope. Neither
is right alone: configs treats the cells of one engine start as independent (too narrow if a start moves its
cells together), engine passes leave 8 units per output length (percentile intervals of 8 units run narrow)."""


def near_repeats(cells: Sequence[Cell], reps: int, seed: int
                 ) -> tuple[dict[str, Any], LeaseNoise, dict[str, list[LeaseNoise]]]:
    """The noise by output length from the three agreement levels (:func:`two_level_sd`, :func:`fit_lease_noise`)
    with stratified bootstrap intervals (the envelope over :data:`BOOTSTRAP_UNITS`), the by-pair, by-output raw
    figures for the record, and the joint fit of every resample by scheme (for intervals of what depends on the
    noise)."""
    configs, E = level_errors(cells)
    types = np.array([k[1] for k in configs])
    kinds = sorted(np.unique(types).tolist())
    col = {a: i for i, a in enumerate(LEVELS)}
    warm_a, warm_b = LEVELS[1], LEVELS[2]
    rng = np.random.default_rng(seed)
    warm = two_level_sd(E[:, col[warm_a]], E[:, col[warm_b]], types)
    ratio = warm[kinds[0]] / warm[kinds[-1]]
    joint = fit_lease_noise(E, types)

    fits: dict[str, list[LeaseNoise]] = {}
    by_unit: dict[str, dict[str, Any]] = {}
    for scheme, unit_of in BOOTSTRAP_UNITS.items():
        units = np.array([unit_of(k) for k in configs])
        boot_warm = bootstrap(lambda i: [two_level_sd(E[i, col[warm_a]], E[i, col[warm_b]], types[i])[k] for k in kinds],
                              types, units, reps, rng)
        boot_ratio = boot_warm[:, 0] / boot_warm[:, -1]
        mine: list[LeaseNoise] = []

        def joint_of(i: np.ndarray, mine: list[LeaseNoise] = mine) -> list[float]:
            r = fit_lease_noise(E[i], types[i])
            mine.append(r)
            return [r.sd[k] for k in kinds] + [r.lease1_extra]
        boot_joint = bootstrap(joint_of, types, units, reps, rng)
        fits[scheme] = mine
        by_unit[scheme] = {"units": len(np.unique(units)),
                           "warm": {str(k): _ci(boot_warm[:, j]) for j, k in enumerate(kinds)},
                           "ratio": _ci(boot_ratio), "p_ratio_le_1": float(np.mean(boot_ratio <= 1.0)),
                           "joint": {str(k): _ci(boot_joint[:, j]) for j, k in enumerate(kinds)},
                           "lease1_extra": _ci(boot_joint[:, -1])}

    def env(*path: str) -> list[float]:
        out = []
        for b in by_unit.values():
            for p in path:
                b = b[p]
            out.append(b)
        return envelope(out)

    by_pair = {}
    for a, b in LEVEL_PAIRS:
        d = E[:, col[a]] - E[:, col[b]]
        by_pair[f"a{a:g}-a{b:g}"] = {"pairs": int(d.size), "mean": float(d.mean()),
                                     "sd_raw": one_run_sd(d, centre=False), "sd_centred": one_run_sd(d, centre=True),
                                     "sd_centred_by_output": {str(k): v for k, v in two_level_sd(E[:, col[a]], E[:, col[b]], types).items()}}
    result = {
        "configs": len(configs), "by_pair": by_pair,
        "warm_pair": {"pair": f"a{warm_a:g}-a{warm_b:g} (leases 2 and 3, both with per-concurrency warm-up)",
                      "sd": {str(k): warm[k] for k in kinds},
                      "interval": {str(k): env("warm", str(k)) for k in kinds},
                      "ratio": ratio, "ratio_interval": env("ratio"),
                      "p_ratio_le_1": max(b["p_ratio_le_1"] for b in by_unit.values())},
        "joint": {"sd": {str(k): joint.sd[k] for k in kinds},
                  "interval": {str(k): env("joint", str(k)) for k in kinds},
                  "lease1_extra": joint.lease1_extra, "lease1_extra_interval": env("lease1_extra"),
                  "shift_lease1_minus_lease3": joint.shifts[0], "shift_lease2_minus_lease3": joint.shifts[1]},
        "bootstrap": {"reps": reps, "seed": seed, "by_unit": by_unit,
                      "resampled": "configs and, separately, engine passes (draft count x output length x temperature, "
                                   f"{by_unit['engine passes']['units']} of 5 configs each), within each output length; "
                                   "intervals are the envelope of the two"},
        "draft_count_F": draft_count_f(E, configs, col[warm_a], col[warm_b]),
    }
    return result, joint, fits


def draft_count_f(E: np.ndarray, configs: Sequence[tuple[int, int, float, int]], a: int, b: int) -> dict[str, Any]:
    """One-way F of the warm level difference ``E[:, a] - E[:, b]`` between draft counts (one engine start each
    per lease), per output length: how much configs that share engine starts move together."""
    d = E[:, a] - E[:, b]
    draft, out = np.array([k[0] for k in configs]), np.array([k[1] for k in configs])
    res = {}
    for o in np.unique(out).tolist():
        x, g = d[out == o], draft[out == o]
        labels = np.unique(g)
        k, n = len(labels), len(x)
        ssb = sum((g == u).sum() * (x[g == u].mean() - x.mean()) ** 2 for u in labels)
        ssw = sum(((x[g == u] - x[g == u].mean()) ** 2).sum() for u in labels)
        f = float((ssb / (k - 1)) / (ssw / (n - k)))
        res[str(o)] = {"F": f, "df": [k - 1, n - k], "p": f_sf(f, k - 1, n - k)}
    return res


# ----------------------------------------------------------------------------------------------- held-out

OffsetKey = tuple[int, bool]


def offset_key(c: Cell) -> OffsetKey:
    """(lease, MTP on): the unit a level/protocol offset is estimated over."""
    return c.lease, c.draft_tokens > 0


def offset_label(k: OffsetKey) -> str:
    return f"lease {k[0]} {'MTP' if k[1] else 'MTP off'}"


def level_offsets(cells: Sequence[Cell]) -> dict[OffsetKey, float]:
    """Mean log error over the FIT cells of each (lease, MTP on/off) (taken from FIT cells so the held-out check
    does not centre on itself). Not a lease effect: each lease measured one agreement level's MTP engines, and
    lease 1 alone ran without per-concurrency warm-up, so an MTP offset mixes lease, level and protocol. MTP-off
    cells take no offset from MTP cells: a (lease, MTP off) without FIT cells has no offset."""
    out: dict[OffsetKey, list[float]] = {}
    for c in cells:
        if not c.held_out:
            out.setdefault(offset_key(c), []).append(c.log_error)
    return {k: statistics.fmean(v) for k, v in sorted(out.items())}


def centred_error(c: Cell, offsets: Mapping[OffsetKey, float]) -> float:
    """The cell's log error less its (lease, MTP on/off) offset, 0 where there is none."""
    return c.log_error - offsets.get(offset_key(c), 0.0)


def own_error_ml(errors: Sequence[float], noise_var: Sequence[float], *, upper: float = 1.0) -> float:
    """The model's own error ``m``: maximum likelihood of ``e_i ~ N(0, v_i + m^2)`` (mean 0: a bias is part of the
    model's error). 0 when the errors are no larger than the noise."""
    e2, v = np.asarray(errors, dtype=float) ** 2, np.asarray(noise_var, dtype=float)

    def nll(m: float) -> float:
        s = v + m * m
        return float(np.sum(np.log(s) + e2 / s))
    return golden_min(nll, 0.0, upper, tol=1e-6, grid=200)


def noise_variances(cells: Sequence[Cell], noise: LeaseNoise) -> np.ndarray:
    """Each cell's one-run noise variance under ``noise``."""
    return np.array([noise.variance(c.output_len, c.lease) for c in cells])


def own_error_bootstrap(held: Sequence[Cell], offsets: Mapping[OffsetKey, float],
                        fits: Sequence[LeaseNoise]) -> dict[str, list[float]]:
    """The model's own error over ``held`` (raw and centred) under each bootstrap resample's noise fit: the
    noise is known only to ~±20 %, and the own error, a difference of variances, moves with it. The held-out
    errors themselves are not resampled (that would widen the interval further)."""
    raw = np.array([c.log_error for c in held])
    centred = np.array([centred_error(c, offsets) for c in held])
    out: dict[str, list[float]] = {"raw": [], "centred": []}
    for f in fits:
        v = noise_variances(held, f)
        out["raw"].append(own_error_ml(raw, v))
        out["centred"].append(own_error_ml(centred, v))
    return out


def expected_passes(noise_var: Sequence[float], tolerance: float = TOLERANCE) -> float:
    """How many one-run cells an exact-in-expectation model would put within ±``tolerance``."""
    nd = NormalDist()
    lo, hi = math.log(1 - tolerance), math.log(1 + tolerance)
    return float(sum(nd.cdf(hi / math.sqrt(v)) - nd.cdf(lo / math.sqrt(v)) for v in noise_var))


@dataclass(frozen=True)
class GroupStats:
    """A group of cells' errors against their noise."""

    name: str
    n: int
    passes: int
    expected_passes: float
    mean: float
    mean_interval: tuple[float, float]
    t_p: float
    rms: float
    noise_rms: float
    own: float
    chi2_per_df: float
    chi2_p: float


def group_stats(name: str, errors: Sequence[float], noise_var: Sequence[float], passes: int) -> GroupStats:
    """Mean with its t-test against 0 and 95 % t-interval, both from the exact t CDF (:func:`t_two_sided_p`,
    :func:`t_critical`); RMS; the noise's RMS; the model's own error (:func:`own_error_ml`); chi-square of the
    errors against the noise alone, ``sum e^2 / v`` on ``n`` df, its p by Wilson-Hilferty."""
    e, v = np.asarray(errors, dtype=float), np.asarray(noise_var, dtype=float)
    n = int(e.size)
    mean = float(np.mean(e))
    sd = float(np.std(e, ddof=1)) if n > 1 else float("nan")
    if n > 1 and sd > 0:
        se = sd / math.sqrt(n)
        half = t_critical(LEVEL, n - 1) * se
        lo, hi, t_p = mean - half, mean + half, t_two_sided_p(mean / se, n - 1)
    else:
        lo, hi, t_p = mean, mean, float("nan")
    chi2 = float(np.sum(e * e / v))
    return GroupStats(name=name, n=n, passes=passes, expected_passes=expected_passes(v), mean=mean, mean_interval=(lo, hi),
                      t_p=t_p, rms=float(math.sqrt(np.mean(e * e))), noise_rms=float(math.sqrt(np.mean(v))),
                      own=own_error_ml(e, v), chi2_per_df=chi2 / n, chi2_p=chi2_sf(chi2, n))


Selector = Callable[[Cell], bool]

CELL_TYPES: list[tuple[str, Selector]] = [
    ("o128 c4", lambda c: c.output_len == 128 and c.concurrency == 4),
    ("o128 c64", lambda c: c.output_len == 128 and c.concurrency == 64),
    ("o512 c4", lambda c: c.output_len == 512 and c.concurrency == 4),
    ("o512 c64", lambda c: c.output_len == 512 and c.concurrency == 64),
    ("o128 MTP-2 c1/16/256", lambda c: c.output_len == 128 and c.draft_tokens == 2 and c.concurrency in (1, 16, 256)),
    ("o512 MTP-2 c1/16/256", lambda c: c.output_len == 512 and c.draft_tokens == 2 and c.concurrency in (1, 16, 256)),
]
"""The held-out half split by what was interpolated (load at c4 / c64, draft count at MTP-2) and by output length
(whose noise differs): every held-out cell is in exactly one."""
OTHER_GROUPS: list[tuple[str, Selector]] = [
    ("all held-out", lambda c: True),
    ("o128", lambda c: c.output_len == 128),
    ("o512", lambda c: c.output_len == 512),
    ("MTP off", lambda c: c.draft_tokens == 0),
    ("T0", lambda c: c.temperature == 0.0),
    ("T0.8", lambda c: c.temperature == 0.8),
]


def decompose(cells: Sequence[Cell], noise: LeaseNoise, offsets: Mapping[OffsetKey, float], *, centre: bool,
              groups: Sequence[tuple[str, Selector]]) -> list[GroupStats]:
    """:func:`group_stats` of each group of held-out cells, errors raw or less their level/protocol offset
    (:func:`centred_error`); passes always on the raw error (the bar the fit is judged by)."""
    out = []
    for name, sel in groups:
        mine = [c for c in cells if c.held_out and sel(c)]
        if not mine:
            continue
        e = [centred_error(c, offsets) if centre else c.log_error for c in mine]
        v = [noise.variance(c.output_len, c.lease) for c in mine]
        out.append(group_stats(name, e, v, sum(c.passes for c in mine)))
    return out


def flag_biased(types: Sequence[GroupStats], alpha: float = 0.05) -> list[str]:
    """The cell types whose mean error differs from 0 at ``alpha`` after Bonferroni over the types tested."""
    return [g.name for g in types if g.t_p < alpha / len(types)]


def bar_verdict(g: GroupStats, bar: float = TYPE_BAR) -> str:
    """A cell type against the proposed bar, symmetric in what it asks of the data: ``meets`` when the 95 %
    interval of its mean lies wholly inside ``[log(1 - bar), log(1 + bar)]``, ``fails`` when it lies wholly
    outside (``b < lo`` or ``a > hi``), else ``undecided`` (the interval crosses an edge: the data cannot say,
    whatever the point estimate)."""
    lo, hi = math.log(1 - bar), math.log(1 + bar)
    a, b = g.mean_interval
    if lo <= a and b <= hi:
        return "meets"
    if b < lo or a > hi:
        return "fails"
    return "undecided"


# ----------------------------------------------------------------------------------------------- decidability

RUNS = (1, 2, 4, 8, 16, 32, 64)
LEASE_SDS = (0.0, 0.03, 0.06)


def shrink(errors: np.ndarray, noise_var: np.ndarray, prior_mean: np.ndarray, prior_sd: float) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and sd of each cell's true error: prior ``N(prior_mean, prior_sd^2)`` (its type's mean error,
    the model's own error about it), one run observed with ``noise_var``. Why: a cell's one-run error is mostly
    noise, so where its true error lies, and how far from a band edge, is best guessed from its type as well."""
    w = prior_sd ** 2 / (prior_sd ** 2 + noise_var)
    return prior_mean + w * (errors - prior_mean), np.sqrt(prior_sd ** 2 * noise_var / (prior_sd ** 2 + noise_var))


def decided_share(theta_mean: np.ndarray, theta_sd: np.ndarray, run_sd: np.ndarray, runs: int, lease_sd: float,
                  rng: np.random.Generator, draws: int, tolerance: float = TOLERANCE) -> np.ndarray:
    """Per cell, the chance that the mean of ``runs`` future runs decides the ±``tolerance`` bar: its 95 % interval
    (``1.96 x se``, ``se^2 = run_sd^2 / runs + lease_sd^2``: a lease's shift does not average out over runs in one
    lease) wholly inside the band or wholly outside it, the true error drawn from its posterior."""
    lo, hi = math.log(1 - tolerance), math.log(1 + tolerance)
    theta = theta_mean[:, None] + theta_sd[:, None] * rng.standard_normal((theta_mean.size, draws))
    se = np.sqrt(run_sd ** 2 / runs + lease_sd ** 2)[:, None]
    x = theta + se * rng.standard_normal(theta.shape)
    h = 1.959964 * se
    return (((x - h >= lo) & (x + h <= hi)) | (x + h < lo) | (x - h > hi)).mean(axis=1)


def runs_to_resolve(distance: float, run_sd: float, z: float = 1.959964) -> int:
    """Warm runs whose mean's 95 % half-width (``z x run_sd / sqrt(k)``, no lease shift) is under ``distance``:
    what a cell ``distance`` from a band edge needs, at best, before one side can be called."""
    return math.ceil((z * run_sd / distance) ** 2)


def decidability(cells: Sequence[Cell], noise: LeaseNoise, draws: int, seed: int) -> dict[str, Any]:
    """How many runs per cell would decide the ±10 % bar cell by cell (raw errors; future runs warm, so no
    lease-1 extra): the expected share of held-out cells decided, by runs per cell and the sd of a lease's shift.
    The prior's sd is the model's own error about each cell type's mean (type means removed: the own error
    about 0 holds the types' biases, which the prior's means already carry)."""
    held = [c for c in cells if c.held_out]
    e = np.array([c.log_error for c in held])
    v = noise_variances(held, noise)
    type_of = [next(n for n, sel in CELL_TYPES if sel(c)) for c in held]
    means = {n: float(np.mean([x for x, t in zip(e, type_of) if t == n])) for n, _ in CELL_TYPES}
    prior_mean = np.array([means[t] for t in type_of])
    prior_sd = own_error_ml(e - prior_mean, v)
    mu, sd = shrink(e, v, prior_mean, prior_sd)
    run_sd = np.array([noise.sd[c.output_len] for c in held])
    out = np.array([c.output_len for c in held])
    rng = np.random.default_rng(seed)
    rows = []
    for lease_sd in LEASE_SDS:
        shares = {k: decided_share(mu, sd, run_sd, k, lease_sd, rng, draws) for k in RUNS}
        rows.append({"lease_sd": lease_sd, "all": {str(k): float(s.mean()) for k, s in shares.items()},
                     **{f"o{o}": {str(k): float(s[out == o].mean()) for k, s in shares.items()} for o in np.unique(out).tolist()}})
    lo, hi = math.log(1 - TOLERANCE), math.log(1 + TOLERANCE)
    edge = np.minimum(np.abs(mu - lo), np.abs(mu - hi))
    distances = (0.01, 0.02, 0.05)
    return {"prior_sd": prior_sd, "draws": draws, "seed": seed, "rows": rows,
            "inside_band": float(np.mean((mu >= lo) & (mu <= hi))),
            "near_edge": {str(d): float(np.mean(edge < d)) for d in distances},
            "runs_to_resolve": {str(d): {str(k): runs_to_resolve(d, s) for k, s in sorted(noise.sd.items())}
                                for d in distances}}


# ----------------------------------------------------------------------------------------------- run

def analyse(landscape: Mapping[str, Any], fit: Mapping[str, Any], *, reps: int, seed: int, draws: int,
            landscape_path: Path | str | None = None) -> dict[str, Any]:
    """Everything the write-up reports, as plain data."""
    cells = join_cells(landscape, fit, landscape_path)
    repeats = direct_repeats(landscape)
    near, noise, fits = near_repeats(cells, reps, seed)
    offsets = level_offsets(cells)
    held = [c for c in cells if c.held_out]
    kinds: dict[str, Any] = {}
    for centre in (False, True):
        label = "centred" if centre else "raw"
        types = decompose(cells, noise, offsets, centre=centre, groups=CELL_TYPES)
        flagged = flag_biased(types)
        rest_sel = [(n, s) for n, s in CELL_TYPES if n not in flagged]
        rest = decompose(cells, noise, offsets, centre=centre,
                         groups=[("other types", lambda c, sel=tuple(rest_sel): any(s(c) for _, s in sel))])
        kinds[label] = {"groups": [asdict(g) for g in decompose(cells, noise, offsets, centre=centre, groups=OTHER_GROUPS)],
                        "types": [asdict(g) | {"bar": bar_verdict(g)} for g in types],
                        "flagged": flagged, "rest_post_hoc": asdict(rest[0]) if rest and flagged else None}
    warm = [g for g in repeats["groups"] if g["warm"]]
    old_noise = warm[0]["sd_raw"] if warm else float("nan")
    all_raw = next(g for g in kinds["raw"]["groups"] if g["name"] == "all held-out")
    all_c = next(g for g in kinds["centred"]["groups"] if g["name"] == "all held-out")
    boot_own = {scheme: own_error_bootstrap(held, offsets, f) for scheme, f in fits.items() if f}
    one_run_half = [1.959964 * math.sqrt(v) for v in noise_variances(held, noise)]
    old = fit.get("one_run_noise") or {}
    verdict = {
        "old_noise": old_noise,
        "old_own": math.sqrt(max(all_raw["rms"] ** 2 - old_noise ** 2, 0.0)),
        "old_expected_pass_share": expected_passes([old_noise ** 2] * len(held)) / len(held),
        "old_fit_pass_share": old.get("exact_model_pass_share"), "old_fit_sigma": old.get("one_run_log_sigma"),
        "own_raw": all_raw["own"], "own_centred": all_c["own"],
        "own_raw_interval": envelope([_ci(np.array(b["raw"])) for b in boot_own.values()]) if boot_own else None,
        "own_centred_interval": envelope([_ci(np.array(b["centred"])) for b in boot_own.values()]) if boot_own else None,
        "own_interval_by_unit": {scheme: {k: _ci(np.array(x)) for k, x in b.items()} for scheme, b in boot_own.items()},
        "observed_passes": all_raw["passes"], "cells": all_raw["n"],
        "expected_pass_share": all_raw["expected_passes"] / all_raw["n"],
        "one_run_half_width_median": float(np.median(one_run_half)),
        "one_run_half_width_range": [float(min(one_run_half)), float(max(one_run_half))],
        "band_half_width": math.log(1 + TOLERANCE),
    }
    clean = {"warm_repeat_lease2_minus_lease1": -warm[0]["mean_log_ratio"] if warm else None,
             "mtp_offset_lease2_minus_lease1": (offsets[(2, True)] - offsets[(1, True)]
                                                if (1, True) in offsets and (2, True) in offsets else None)}
    return {"cells": len(cells), "held_out_cells": len(held),
            "offsets": {offset_label(k): {"offset": o, "fit": sum(1 for c in cells if offset_key(c) == k and not c.held_out),
                                          "held_out": sum(1 for c in held if offset_key(c) == k)}
                        for k, o in offsets.items()},
            "offsets_missing": [offset_label(k) for k in sorted({offset_key(c) for c in held}) if k not in offsets],
            "lease_check": clean,
            "direct_repeats": repeats, "near_repeats": near,
            "noise_used": {"sd": {str(k): v for k, v in noise.sd.items()}, "lease1_extra": noise.lease1_extra},
            "held_out": kinds, "verdict": verdict,
            "decidability": decidability(cells, noise, draws, seed + 1) if draws else None}


def _pct(x: float) -> str:
    return f"{math.exp(x) - 1:+.1%}"


def _p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _group_table(groups: Sequence[Mapping[str, Any]], *, bar: bool = False) -> list[str]:
    head = ("| group | cells | ±10 % passes (exact model expects) | mean log error [95 % CI] | t-test p | RMS | noise RMS "
            "| own error (ML) | chi²/df | chi² p |" + (" ±5 % bar |" if bar else ""))
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for g in groups:
        lo, hi = g["mean_interval"]
        lines.append(f"| {g['name']} | {g['n']} | {g['passes']} ({g['expected_passes']:.1f}) | {g['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}] "
                     f"| {_p(g['t_p'])} | {g['rms']:.3f} | {g['noise_rms']:.3f} | {g['own']:.3f} | {g['chi2_per_df']:.2f} "
                     f"| {_p(g['chi2_p'])} |" + (f" {g['bar']} |" if bar else ""))
    return lines


def _iv(x: Sequence[float] | None) -> str:
    return f"[{x[0]:.3f}, {x[1]:.3f}]" if x else "[no bootstrap]"


def _names(gs: Sequence[Mapping[str, Any]], verdict: str) -> list[str]:
    return [g["name"] for g in gs if g["bar"] == verdict]


def _bar_sentence(types: Sequence[Mapping[str, Any]]) -> str:
    """The ±5 % bar's three outcomes over the cell types, as one clause."""
    meets, fails, undecided = (_names(types, k) for k in ("meets", "fails", "undecided"))
    return ((f"**fails** (whole interval outside): {', '.join(fails)}; " if fails else "none fails (no interval wholly outside); ")
            + (f"meets: {', '.join(meets)}; " if meets else "none meets (no interval wholly inside); ")
            + (f"undecided (interval crosses an edge): {', '.join(undecided)}." if undecided else "none undecided."))


def _bar_sensitivity(raw: Sequence[Mapping[str, Any]], centred: Sequence[Mapping[str, Any]]) -> str:
    """The bar verdicts with level/protocol offsets removed, as far as they differ from the raw ones."""
    changed = [(g["name"], h["bar"]) for g, h in zip(raw, centred) if g["bar"] != h["bar"]]
    if not changed:
        return "The same verdicts with level/protocol offsets removed."
    return "With level/protocol offsets removed: " + ", ".join(f"{n} {b}" for n, b in changed) + " (the others unchanged)."


def _flag_sentence(h: Mapping[str, Any], label: str) -> str:
    """What the flagged types' t-tests and bar verdicts together support."""
    flagged = [g for g in h["types"] if g["name"] in h["flagged"]]
    if not flagged:
        return f"No cell type's mean error ({label}) differs from 0 (t-test, Bonferroni over the six types)."
    said = "; ".join(f"{g['name']} mean {g['mean']:+.3f} ({_pct(g['mean'])}) [{g['mean_interval'][0]:+.3f}, "
                     f"{g['mean_interval'][1]:+.3f}], p {_p(g['t_p'])}" for g in flagged)
    undecided = [g for g in flagged if g["bar"] == "undecided"]
    fails = [g["name"] for g in flagged if g["bar"] == "fails"]
    out = f"Mean error ({label}) differs from 0 (t-test, Bonferroni over the six cell types): {said}."
    if undecided:
        lo, hi = math.log(1 - TYPE_BAR), math.log(1 + TYPE_BAR)
        edges = sorted({f"log {1 - TYPE_BAR:g} = {lo:+.3f}" if g["mean_interval"][0] < lo else f"log {1 + TYPE_BAR:g} = {hi:+.3f}"
                        for g in undecided})
        out += (f" Whether {'it exceeds' if len(undecided) == 1 else 'they exceed'} ±{TYPE_BAR:.0%} the data cannot say: "
                f"{'its' if len(undecided) == 1 else 'each'} 95 % interval crosses {' or '.join(edges)} "
                f"({', '.join(g['name'] for g in undecided)}: undecided on the ±{TYPE_BAR:.0%} bar).")
    if fails:
        out += f" Beyond ±{TYPE_BAR:.0%} with the whole interval: {', '.join(fails)}."
    return out


def _rest_sentence(h: Mapping[str, Any]) -> str:
    rest = h["rest_post_hoc"]
    if not rest:
        return ""
    return (f"Post hoc (exploratory: this split was chosen after the flags, so its p-values are not tests): the other "
            f"{rest['n']} cells have mean {rest['mean']:+.3f} (p {_p(rest['t_p'])}), chi²/df {rest['chi2_per_df']:.2f} "
            f"(p {_p(rest['chi2_p'])}), own error {rest['own']:.3f}.")


def summary_lines(r: Mapping[str, Any]) -> list[str]:
    """The headline figures, for the console and the write-up."""
    near, v = r["near_repeats"], r["verdict"]
    w, j = near["warm_pair"], near["joint"]
    raw, c = r["held_out"]["raw"], r["held_out"]["centred"]
    return [
        f"- One-run noise by output length (a0.9 - a0.5, warm leases): o128 **{w['sd']['128']:.3f}** "
        f"[{w['interval']['128'][0]:.3f}, {w['interval']['128'][1]:.3f}], o512 **{w['sd']['512']:.3f}** "
        f"[{w['interval']['512'][0]:.3f}, {w['interval']['512'][1]:.3f}] (ratio {w['ratio']:.2f}, "
        f"[{w['ratio_interval'][0]:.2f}, {w['ratio_interval'][1]:.2f}]); all three leases jointly: o128 {j['sd']['128']:.3f}, "
        f"o512 {j['sd']['512']:.3f}, plus {j['lease1_extra']:.3f} in lease 1.",
        f"- Model's own error over the {v['cells']} held-out cells, with per-type noise: **{v['own_raw']:.3f}** raw, 95 % "
        f"{_iv(v['own_raw_interval'])} (bootstrap refitting the noise per resample); sensitivity check with level/protocol "
        f"offsets removed: {v['own_centred']:.3f} {_iv(v['own_centred_interval'])}. The earlier figure, every cell given the "
        f"warm-repeat noise {v['old_noise']:.3f}: {v['old_own']:.3f}.",
        f"- {_flag_sentence(raw, 'raw')}",
        f"- ±{TYPE_BAR:.0%} cell-type bar (95 % interval of the mean wholly inside: meets; wholly outside: fails), raw: "
        f"{_bar_sentence(raw['types'])} " + _bar_sensitivity(raw["types"], c["types"]),
        *([f"- {_rest_sentence(raw)}"] if raw["rest_post_hoc"] else []),
        f"- ±10 % passes: {v['observed_passes']} of {v['cells']}; an exact-in-expectation model would pass "
        f"{v['expected_pass_share']:.0%} of them with one run each.",
    ]


def _decide_lines(d: Mapping[str, Any] | None, noise_sd: Mapping[str, float]) -> list[str]:
    """Section 5: the share of held-out cells that k runs each would decide."""
    if not d:
        return []
    runs = list(d["rows"][0]["all"])
    head = "| lease shift sd | cells | " + " | ".join(f"{k} run{'s' if k != '1' else ''}" for k in runs) + " |"
    lines = ["## 5. Runs per cell to decide the ±10 % bar", "",
             "Each held-out cell's true error (raw) is guessed from its one run and its type: prior its cell type's mean "
             f"with the model's own error about the type means ({d['prior_sd']:.3f}, maximum likelihood with the six type "
             "means removed; the own error about 0 would count the types' biases twice) as sd, posterior after the one run. "
             "Future runs are warm (o128 / o512 noise as above, no lease-1 extra), and a lease's shift (sd in the first "
             "column) does not average out over runs made in one lease. A cell is decided when the 95 % interval of its "
             f"runs' mean lies wholly inside or wholly outside the ±10 % band; expected share decided, {d['draws']} "
             f"simulated futures per cell (seed {d['seed']}).", "", head, "|" + "---|" * (head.count("|") - 1)]
    for row in d["rows"]:
        for part in [k for k in row if k not in ("lease_sd",)]:
            lines.append(f"| {row['lease_sd']:.2f} | {part} | " + " | ".join(f"{row[part][k]:.0%}" for k in runs) + " |")
    near, need = d["near_edge"], d["runs_to_resolve"]
    kinds = sorted(noise_sd, key=int)
    lines += ["", f"Posterior-mean true errors inside the band: {d['inside_band']:.0%}; within 0.01 / 0.02 / 0.05 of a band "
              f"edge: {near['0.01']:.0%} / {near['0.02']:.0%} / {near['0.05']:.0%}. These distances are posterior means, "
              "not the cells' true distances. A cell a distance d from an edge needs at least (1.96 sd / d)² warm runs "
              "(no lease shift) before its side can be called: "
              + "; ".join(f"d = {x}: " + " / ".join(f"{need[x][k]} (o{k})" for k in kinds) for x in need)
              + f". So cells within ~0.01 of an edge need hundreds of runs ({min(need['0.01'].values())}-"
              f"{max(need['0.01'].values())}); those 0.05 away, {min(need['0.05'].values())}-{max(need['0.05'].values())}.", ""]
    return lines


def render_md(r: Mapping[str, Any]) -> str:
    """The write-up."""
    prov, near, rep, v = r["provenance"], r["near_repeats"], r["direct_repeats"], r["verdict"]
    w, j = near["warm_pair"], near["joint"]
    raw, c = r["held_out"]["raw"], r["held_out"]["centred"]
    boot = near["bootstrap"]
    lines = [
        "# Simulator fit of the MoE testbed: how much of the held-out error is measurement noise",
        "",
        "**An analysis of committed GPU measurements, run on this machine's CPU.** The measured throughputs are one "
        "closed-loop run per cell on one H200 (`measure_landscape.py`); the SIMULATED throughputs come from the "
        "committed fit (`sim_fit_testbed.py`); nothing was run on a GPU or in the simulator for this.",
        "",
        f"Command: `{prov['command']}` ({prov['created_at']}, {prov['wall_s']:.1f} s on this machine's CPU, commit "
        f"{prov['git_commit']}, Python {prov['python']}, NumPy {prov['numpy']}).",
        "",
        f"- Measured: `{prov['landscape']}` (sha256 {prov['landscape_sha256']}), {r['cells']} cells.",
        f"- SIMULATED: `{prov['fit']}` (sha256 {prov['fit_sha256']}), {r['held_out_cells']} held-out cells.",
        f"- Bootstrap: {boot['reps']} resamples of {boot['resampled']}, seed {boot['seed']}.",
        "",
        "## Summary",
        "",
        *summary_lines(r),
        "",
        "## 1. Direct repeats",
        "",
        f"{rep['pairs']} cells measured in two leases (all MTP off; `superseded` holds the earlier run). log(current / "
        "earlier); one-run sd raw = sqrt(mean d² / 2) (`tuning.simfit.repeat_noise`: a lease shift counted as noise), "
        "centred = the shift removed; the raw sd's 95 % chi-square interval (Wilson-Hilferty quantiles).",
        "",
        "| group | pairs: log ratio (runs' seconds) | mean | one-run sd raw [95 %] | centred |",
        "|---|---|---|---|---|",
    ]
    for g in rep["groups"]:
        pairs = ", ".join(f"{p['key'].rsplit('|', 1)[-1]} {p['log_ratio']:+.3f} ({p['earlier_s']:.1f}/{p['later_s']:.1f} s)"
                          for p in g["pairs"])
        lo, hi = g["sd_raw_interval"]
        lines.append(f"| {g['label']}{' (**warm both**)' if g['warm'] else ''} | {pairs} | {g['mean_log_ratio']:+.3f} "
                     f"| {g['sd_raw']:.3f} [{lo:.3f}, {hi:.3f}] | {g['sd_centred']:.3f} |")
    lines += [
        "",
        "Only the output-512 greedy pairs were warm both times; they are the earlier write-up's noise floor. The others "
        "hold a first pass's start-up cost, so they say how much the protocol moves a figure, not one run's noise.",
        "",
        "## 2. Noise by cell type from near-repeats",
        "",
        f"Each of the {near['configs']} MTP engine configs (MTP-1..4 x output 128/512 x T 0/0.8 x concurrency 1..256) was "
        "measured at agreement 0.7 (lease 1), 0.9 (lease 2) and 0.5 (lease 3). The step constants are shared by the "
        "levels, so the difference of two levels' log errors log(sim/meas) cancels the misfit they share and leaves two "
        "runs' noise plus any misfit that differs between levels (acceptance is fitted per level): an **upper bound** on "
        "noise. Centred: the mean difference (the leases' shift) removed. Intervals: the envelope of two bootstraps, "
        "over configs and over engine passes (caveats).",
        "",
        "| level pair | pairs | mean d | one-run sd raw | centred | centred o128 | centred o512 |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, p in near["by_pair"].items():
        lines.append(f"| {name} | {p['pairs']} | {p['mean']:+.3f} | {p['sd_raw']:.3f} | {p['sd_centred']:.3f} "
                     f"| {p['sd_centred_by_output']['128']:.3f} | {p['sd_centred_by_output']['512']:.3f} |")
    lines += [
        "",
        f"- **Warm leases only (a0.9 - a0.5)**: one run's sd o128 **{w['sd']['128']:.3f}** (95 % bootstrap "
        f"{w['interval']['128'][0]:.3f}-{w['interval']['128'][1]:.3f}), o512 **{w['sd']['512']:.3f}** "
        f"({w['interval']['512'][0]:.3f}-{w['interval']['512'][1]:.3f}); o128 / o512 {w['ratio']:.2f} "
        f"({w['ratio_interval'][0]:.2f}-{w['ratio_interval'][1]:.2f}; share of resamples at or below 1: {w['p_ratio_le_1']:.3f}).",
        f"- **All three leases jointly** (likelihood of each config's two contrasts, lease 1 - 3 and 2 - 3, so each "
        f"config's own misfit drops out; a mean shift per lease; one sd per output length and an extra sd for lease 1, "
        f"which had no per-concurrency warm-up and is also the only a0.7 lease): o128 **{j['sd']['128']:.3f}** "
        f"({j['interval']['128'][0]:.3f}-{j['interval']['128'][1]:.3f}), o512 **{j['sd']['512']:.3f}** "
        f"({j['interval']['512'][0]:.3f}-{j['interval']['512'][1]:.3f}), lease 1 extra **{j['lease1_extra']:.3f}** "
        f"({j['lease1_extra_interval'][0]:.3f}-{j['lease1_extra_interval'][1]:.3f}); shifts lease 1 - 3 "
        f"{j['shift_lease1_minus_lease3']:+.3f}, lease 2 - 3 {j['shift_lease2_minus_lease3']:+.3f}. These are the noise "
        "variances used below (a cell's: its output length's sd², plus the extra² in lease 1).",
        "",
        "## 3. Held-out decomposition",
        "",
        "Per group of held-out cells: ±10 % passes on the raw error beside what a model exact in expectation would "
        "pass with this noise; the mean log error with its 95 % t-interval and two-sided t-test p (both from the exact "
        "t CDF); RMS; the noise's RMS; the model's own error, the maximum-likelihood m in e ~ N(0, noise² + m²) (mean 0, "
        "so a bias counts as the model's); chi² = sum e² / noise² on n df against noise alone (noise taken as known), "
        "its p by the Wilson-Hilferty normal approximation.",
        "",
        "Raw errors lead. As a sensitivity check the same tables follow with a **level/protocol offset** removed per "
        "(lease, MTP on/off): the mean log error of that lease's FIT cells of the same kind (MTP-off cells take nothing "
        "from MTP cells). Not lease effects: see caveats. Offsets: "
        + ", ".join(f"{k} {o['offset']:+.3f} ({o['fit']} FIT / {o['held_out']} held-out cells)" for k, o in r["offsets"].items())
        + (f"; none for {', '.join(r['offsets_missing'])} (no FIT cells)." if r["offsets_missing"] else "."),
        "",
    ]
    for label, title in (("raw", "Raw"), ("centred", "Sensitivity check: level/protocol offsets removed")):
        h = r["held_out"][label]
        lines += [f"### {title}", "", *_group_table(h["groups"]), "",
                  "By cell type (every held-out cell in one; ±5 % bar: section 4):", "", *_group_table(h["types"], bar=True), "",
                  _flag_sentence(h, "raw" if label == "raw" else "offsets removed")
                  + (" " + _rest_sentence(h) if h["rest_post_hoc"] else ""), ""]
    lc = r["lease_check"]
    lines += [
        "## 4. Verdict",
        "",
        f"- The earlier write-up's \"model's own error ~12 %\" took the warm repeats' one-run sd ({v['old_noise']:.3f}) for "
        f"every cell: sqrt({next(g for g in raw['groups'] if g['name'] == 'all held-out')['rms']:.3f}² - "
        f"{v['old_noise']:.3f}²) = {v['old_own']:.3f}. With the noise measured per cell type it is **{v['own_raw']:.3f}** "
        f"raw, 95 % {_iv(v['own_raw_interval'])} (maximum likelihood over all {v['cells']} held-out cells; the interval "
        f"from {boot['reps']} bootstrap refits of the noise per scheme, the envelope of the two schemes, the held-out "
        f"errors held fixed); {v['own_centred']:.3f} "
        f"{_iv(v['own_centred_interval'])} with level/protocol offsets removed (sensitivity check).",
        f"- The ±10 %-per-cell bar cannot be decided from one run per cell: one run's 95 % interval is ±{v['one_run_half_width_median']:.2f} "
        f"in log (median cell; {v['one_run_half_width_range'][0]:.2f}-{v['one_run_half_width_range'][1]:.2f}), wider than "
        f"the whole band ({math.log(1 - TOLERANCE):+.3f} to {v['band_half_width']:+.3f} in log), and a model exact in expectation would pass only "
        f"**{v['expected_pass_share']:.0%}** of these cells (observed {v['observed_passes']} of {v['cells']}, "
        f"{v['observed_passes'] / v['cells']:.0%}).",
        f"- With {v['old_noise']:.3f} everywhere, the earlier write-up's figure was "
        + (f"{v['old_fit_pass_share']:.1%} (the fit JSON's `one_run_noise.exact_model_pass_share`, noise "
           f"{v['old_fit_sigma']:.4f}, band ±log 1.1 = ±{math.log(1 + TOLERANCE):.3f}); " if v.get("old_fit_pass_share") is not None
           else "not recorded in the fit JSON; ")
        + f"this script uses the band the pass count is made with, |sim / meas - 1| <= 10 %, i.e. [log 0.9, log 1.1] = "
        f"[{math.log(1 - TOLERANCE):+.3f}, {math.log(1 + TOLERANCE):+.3f}], which gives **{v['old_expected_pass_share']:.0%}**.",
        f"- A bar that repeated runs can decide (a cell type pools its cells' runs, a cell has only its own): every cell "
        f"type's mean error within ±{TYPE_BAR:.0%}, judged by its 95 % interval (meets: wholly inside; fails: wholly "
        "outside; else undecided), and the model's own error stated against the measured noise. Today, one run per "
        f"cell, raw: {_bar_sentence(raw['types'])} " + _bar_sensitivity(raw["types"], c["types"]),
        f"- {_flag_sentence(raw, 'raw')}" + (" " + _rest_sentence(raw) if raw["rest_post_hoc"] else ""),
        f"- Own error {v['own_raw']:.3f} {_iv(v['own_raw_interval'])} (raw, all held-out cells) against one run's noise of "
        f"{j['sd']['512']:.3f} (o512) to {j['sd']['128']:.3f} (o128).",
        "",
        *_decide_lines(r.get("decidability"), r["noise_used"]["sd"]),
        "## Caveats",
        "",
        "- The near-repeat noise is an upper bound: acceptance is fitted per agreement level, so misfit that differs "
        "between levels is counted as noise, and with it the own error is a lower-side estimate.",
        "- The level/protocol offsets are confounded: each MTP agreement level is one lease (a0.7 lease 1, a0.9 lease 2, "
        "a0.5 lease 3), and lease 1 is also the one without per-concurrency warm-up; "
        + ", ".join(f"{k}: {o['fit']} FIT cells" for k, o in r["offsets"].items())
        + ". An MTP offset is level misfit, lease and protocol at once, and removing it may remove real model error. "
        "The only clean lease comparison, the warm MTP-off o512 T0 repeats, reads lease 2 "
        + (f"{1 - math.exp(-lc['warm_repeat_lease2_minus_lease1']):.0%} slower than lease 1 (log error "
           f"{lc['warm_repeat_lease2_minus_lease1']:+.3f} in lease 2 against lease 1, five pairs), while the MTP offsets "
           f"put lease 2 at {lc['mtp_offset_lease2_minus_lease1']:+.3f} against lease 1: the opposite sign. "
           if lc["warm_repeat_lease2_minus_lease1"] is not None and lc["mtp_offset_lease2_minus_lease1"] is not None else "(not available). ")
        + "Hence raw leads and the offset-removed tables are a sensitivity check, not a correction.",
        "- The same confounding is in the joint noise fit: lease 1 measured only a0.7, so misfit particular to a0.7 "
        "(its acceptance fit) is counted as lease-1 noise in the lease-1 extra, and the lease shifts are level shifts too.",
        "- Configs of one engine start are not independent: `measure_landscape.py` starts one engine per draft count "
        "per lease and measures output length x temperature x concurrency on it, and the warm level difference "
        "a0.9 - a0.5 hints that draft counts differ (one-way F between draft counts: "
        + ", ".join(f"o{o} F = {x['F']:.2f} on ({x['df'][0]}, {x['df'][1]}) df, p {x['p']:.2f}"
                    for o, x in near["draft_count_F"].items())
        + "). The bootstrap is run twice, over configs (treats them as independent) and over engine passes (draft count "
        f"x output length x temperature, five concurrencies each: {boot['by_unit']['engine passes']['units']} units, "
        "8 per output length; passes of one engine start are still treated as independent, and percentile intervals "
        "from 8 units run narrow), and every interval given is the envelope of the two; it may still be too narrow. "
        "Raw per-scheme intervals are in the JSON. Held-out cells of one type share engine starts as well, which the "
        "t-tests (cells independent) do not allow for.",
        "- The own error's interval carries the noise estimate's uncertainty only (the held-out errors are not "
        "resampled). The chi² p-values and the exact-model pass counts take the noise variances as known, though the "
        "noise sd is known only to about ±20 % (section 2), so they are rough; the t-tests use the cells' own spread "
        "and do not depend on it. The lease-1 extra is poorly known.",
        "- The runs-to-decide table uses a normal 1.96 interval whatever the runs (a t interval on few runs is wider), "
        "assumes the noise measured here holds for future warm runs, and ranks cells by posterior means.",
        "",
    ]
    return "\n".join(lines)


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--landscape", type=Path, default=DEFAULT_LANDSCAPE, help="measure_landscape.py landscape.json (all leases)")
    p.add_argument("--fit", type=Path, default=DEFAULT_FIT, help="sim_fit_testbed.py result JSON for that landscape")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the noise intervals")
    p.add_argument("--draws", type=int, default=2000,
                   help="simulated futures per cell for the runs-to-decide table (0: leave it out)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default=None, help="results name (default sim_fit_testbed_noise_<UTC date>)")
    p.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    start = time.monotonic()
    paths = {k: (p if p.is_absolute() else ROOT / p) for k, p in (("landscape", args.landscape), ("fit", args.fit))}
    raw = {k: p.read_bytes() for k, p in paths.items()}  # read once: parsed here, hashed for the record
    landscape, fit = (json.loads(raw[k]) for k in ("landscape", "fit"))
    if landscape.get("simulated"):
        raise NoiseError(f"{args.landscape} is SIMULATED; this analysis needs GPU measurements")
    r = analyse(landscape, fit, reps=args.bootstrap, seed=args.seed, draws=args.draws, landscape_path=paths["landscape"])
    now = datetime.now(timezone.utc)
    name = args.name or f"sim_fit_testbed_noise_{now.date().isoformat()}"
    r["provenance"] = {
        "command": " ".join(["python -m docs.analyses.sim_fit.sim_fit_testbed_noise", *argv]).strip(),
        "created_at": now.isoformat(timespec="seconds"), "git_commit": git_commit(ROOT) or "unknown",
        "python": platform.python_version(), "numpy": np.__version__,
        "landscape": _rel(paths["landscape"]), "landscape_sha256": hashlib.sha256(raw["landscape"]).hexdigest(),
        "fit": _rel(paths["fit"]), "fit_sha256": hashlib.sha256(raw["fit"]).hexdigest(),
        "what": "analysis of committed GPU measurements on this machine's CPU; SIMULATED figures from the committed fit",
        "wall_s": time.monotonic() - start,
    }
    out = args.out_dir if args.out_dir.is_absolute() else ROOT / args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(r, indent=1, default=str) + "\n")
    (out / f"{name}.md").write_text(render_md(r))
    print("\n".join(summary_lines(r)))
    print(f"wrote {_rel(out / (name + '.md'))} and .json ({r['provenance']['wall_s']:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
