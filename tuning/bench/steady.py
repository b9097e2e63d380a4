"""Steady-state early stop: when the output throughput at the bucket's concurrency is known well
enough to stop a run before its slowest requests finish.

With long outputs most of a run's wall time is spent waiting for the slowest requests, while the
figure a sweep ranks by — output throughput at the bucket's concurrency — is known long before.
While the system is saturated (every concurrency slot busy, one full turnover done — the first
``concurrency`` requests finished — and requests still waiting for a slot) the client counts output
tokens per fixed window and computes a batch-means confidence interval of the throughput. Once its
half-width is within ``rel_tolerance`` of the mean (and ``min_windows`` windows are in, and the two
halves of the windows agree, so the rate is not still drifting) *and* the rest of the run is
predictable (:mod:`tuning.bench.drain`), outstanding requests are cancelled (counted as
``cancelled``, not failed) and ``output_throughput`` is the predicted **output throughput of the
whole run**.

The rule needs at least one full turnover and ``min_windows`` windows of steady state, so it saves
time only on runs of several turnovers; shorter runs go to completion. Other figures then come from
what was observed until the stop: latency statistics of completed requests, plus TTFT/ITL/TPOT of
the cancelled requests' received part (so long requests are not left out of the per-token
figures); request/input throughput are completed requests over the shortened duration.
``steady_state`` in the result records the estimate either way.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuning.bench.errors import BenchError
from tuning.stats import t_quantile

__all__ = ["SteadyStateEstimate", "SteadyStateRule"]


@dataclass(frozen=True)
class SteadyStateRule:
    """When to stop a run early: steady-state output throughput known within ``rel_tolerance``.

    Args:
        rel_tolerance: stop once the confidence interval's half-width / mean <= this.
        window_s: length of one measurement window, in the server's time (simulated seconds for
            the simulator). Windows should span many decode steps so batch means are ~independent.
        min_windows: never stop on fewer windows; also the least number of batches the interval
            is computed over (see :meth:`_SteadyStateTracker.estimate`).
        confidence: of the two-sided Student-t interval over the window means.
        drain_tolerance: stop only once the full run's predicted throughput (drain included, at
            ``confidence`` bounds of the measured step-time model) is known within this share
            either way (see :func:`full_run_throughput_bounds`).
    """

    rel_tolerance: float = 0.02
    window_s: float = 5.0
    min_windows: int = 8
    confidence: float = 0.95
    drain_tolerance: float = 0.01

    def __post_init__(self) -> None:
        if not (isinstance(self.rel_tolerance, (int, float)) and 0 < self.rel_tolerance < 1):
            raise BenchError(f"rel_tolerance={self.rel_tolerance!r} is out of range; allowed: (0, 1)")
        if not (isinstance(self.window_s, (int, float)) and self.window_s > 0):
            raise BenchError(f"window_s={self.window_s!r} must be a positive number of seconds")
        if not (isinstance(self.min_windows, int) and self.min_windows >= 3):
            raise BenchError(f"min_windows={self.min_windows!r} must be an integer >= 3")
        if not (isinstance(self.confidence, (int, float)) and 0.5 <= self.confidence < 1):
            raise BenchError(f"confidence={self.confidence!r} is out of range; allowed: [0.5, 1)")
        if not (isinstance(self.drain_tolerance, (int, float)) and 0 < self.drain_tolerance < 1):
            raise BenchError(f"drain_tolerance={self.drain_tolerance!r} is out of range; allowed: (0, 1)")


@dataclass(frozen=True)
class SteadyStateEstimate:
    """Batch-means estimate of steady-state output throughput (tokens/s, server time)."""

    throughput: float
    half_width: float
    windows: int
    """Complete windows observed."""
    batches: int
    """Batches (consecutive windows summed) the interval is computed over."""
    window_s: float
    confidence: float
    saturated_from_s: float
    """Seconds (server time) from the start of the measured run to the first window."""
    full_run_low: float | None = None
    full_run_high: float | None = None
    """Bounds on the output throughput the whole run would have had (:func:`full_run_throughput_bounds`),
    set when the rule stopped the run; the reported figure is their midpoint."""
    drain_model: dict | None = None
    """The measured :class:`StepTimeModel` the bounds were computed with (``None``: model-free bounds)."""

    @property
    def rel_half_width(self) -> float:
        return self.half_width / self.throughput if self.throughput > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["rel_half_width"] = self.rel_half_width
        return out


class _SteadyStateTracker:
    """Output tokens per fixed window while saturated, and the batch-means interval over windows.

    Pure bookkeeping over timestamps given by the caller (wall seconds); no clock of its own.
    """

    def __init__(self, rule: SteadyStateRule, time_scale: float, t0: float) -> None:
        self.rule = rule
        self.time_scale = time_scale
        self.window_wall_s = rule.window_s / time_scale
        self.t0 = t0
        self.start_at: float | None = None
        self.end_at: float | None = None
        self.counts: list[float] = []
        self.stopped_with: SteadyStateEstimate | None = None

    @property
    def active(self) -> bool:
        return self.start_at is not None and self.end_at is None

    def start(self, t: float) -> None:
        if self.start_at is None and self.end_at is None:
            self.start_at = t

    def end(self, t: float) -> None:
        if self.end_at is None:
            self.end_at = t

    def add_tokens(self, t: float, n: float) -> None:
        if not self.active or t < self.start_at:  # type: ignore[operator]
            return
        i = int((t - self.start_at) / self.window_wall_s)  # type: ignore[operator]
        while len(self.counts) <= i:
            self.counts.append(0.0)
        self.counts[i] += n

    def complete_windows(self, now: float) -> list[float]:
        if self.start_at is None:
            return []
        horizon = now if self.end_at is None else min(now, self.end_at)
        n = int((horizon - self.start_at) / self.window_wall_s)
        return (self.counts + [0.0] * max(0, n - len(self.counts)))[:n]

    def estimate(self, now: float) -> SteadyStateEstimate | None:
        """Batch means over the complete windows so far.

        The windows are grouped into ``k = max(min_windows, isqrt(n))`` batches of equal size (the
        oldest leftover windows, nearest the ramp-up, are dropped). Growing batches keep the
        interval honest both when windows are positively correlated (slow drifts) and when they are
        negatively correlated (tokens stamped into a neighbouring window by client or network
        jitter), which a fixed window length would not.
        """
        windows = self.complete_windows(now)
        if len(windows) < 2 or self.start_at is None:
            return None
        k = min(len(windows), max(self.rule.min_windows, math.isqrt(len(windows))))
        size = len(windows) // k
        used = np.asarray(windows[len(windows) - k * size:], dtype=float)
        rates = used.reshape(k, size).sum(axis=1) / (size * self.rule.window_s)  # tokens per server-time second
        mean = float(np.mean(rates))
        sd = float(np.std(rates, ddof=1))
        t = t_quantile(0.5 + self.rule.confidence / 2, k - 1)
        return SteadyStateEstimate(
            throughput=mean,
            half_width=t * sd / math.sqrt(k),
            windows=len(windows),
            batches=k,
            window_s=self.rule.window_s,
            confidence=self.rule.confidence,
            saturated_from_s=(self.start_at - self.t0) * self.time_scale,
        )

    def converged(self, now: float) -> SteadyStateEstimate | None:
        est = self.estimate(now)
        if est is None or est.batches < self.rule.min_windows or est.throughput <= 0:
            return None
        if est.rel_half_width > self.rule.rel_tolerance:
            return None
        # Trend guard: a throughput still drifting (contexts growing, a queue filling) can have a
        # tight interval around a moving mean; require the two halves to agree within tolerance.
        windows = self.complete_windows(now)
        half = len(windows) // 2
        first, second = float(np.mean(windows[:half])), float(np.mean(windows[half:]))
        if abs(second - first) > self.rule.rel_tolerance * max(first, second):
            return None
        return est
