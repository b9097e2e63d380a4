"""Run-to-run variation for the simulated engine (off unless asked for).

The model is exact: the same workload on the same config gives the same figures every time, so a sweep
on simulated engines never leaves a comparison within noise, and what a sweep does with noisy
measurements (confidence intervals, the decide phase over fresh engines, a hard limit cutting rounds)
runs only on GPUs. GPU engines vary in two ways: from run to run (one wave moves 12–17 % on an H200), and
from start to start of one config (a start shifts every round it measures alike, ~5 %). With
:class:`EngineNoise` the simulated engine varies the same two ways: every iteration's time is multiplied
by a factor drawn once per engine start and by one drawn afresh every ``window_s`` simulated seconds,
both log-normal with median 1. The figures remain simulated figures; the noise only makes them vary.

How much a measured run moves depends on its length against the window: a run within one window takes
its factor whole (log sd ``sd``), consecutive short runs in one window move together, and a run over n
windows averages them (about ``sd / sqrt(n)``).
"""
from __future__ import annotations

import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["EngineNoise"]


@dataclass(frozen=True)
class EngineNoise:
    """How much a simulated engine's iteration times vary.

    Args:
        start_sd: log sd of the factor drawn when the engine starts (the same for all its iterations).
        sd: log sd of the factor drawn afresh every ``window_s`` simulated seconds.
        window_s: simulated seconds one run-to-run factor lasts.
        seed: ``None`` draws afresh at every start, so two starts of one config differ as two GPU starts
            do; a number gives the same factors every time, to every engine alike (no variation between
            starts or configs then: for repeatable tests of one engine).
    """

    start_sd: float = 0.0
    sd: float = 0.0
    window_s: float = 5.0
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("start_sd", "sd"):
            v = getattr(self, name)
            if not (math.isfinite(v) and 0.0 <= v <= 2.0):
                raise ValueError(f"{name}={v!r}: a log sd in [0, 2]")
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise ValueError(f"window_s={self.window_s!r}: simulated seconds > 0")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"seed={self.seed!r}: a whole number >= 0, or none for fresh draws at every start")

    @property
    def active(self) -> bool:
        return self.start_sd > 0 or self.sd > 0

    def slowdown(self) -> Callable[[float], float]:
        """One engine start's factor on iteration time, by simulated time (the start's draw made now)."""
        base = self.seed if self.seed is not None else secrets.randbits(63)
        start = math.exp(np.random.default_rng([base, 0]).normal(0.0, self.start_sd)) if self.start_sd else 1.0
        if not self.sd:
            return lambda now: start
        last: list[float] = [-1.0, 1.0]  # the window drawn last, and its factor (iterations ask in order)

        def factor(now: float) -> float:
            k = math.floor(max(now, 0.0) / self.window_s)
            if k != last[0]:
                last[0], last[1] = k, math.exp(np.random.default_rng([base, 1, k]).normal(0.0, self.sd))
            return start * last[1]

        return factor
