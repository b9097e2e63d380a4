"""Several tp=1 engines time-sharing one GPU: whether their memory fits, and whether the plan pays.
Pure: footprints, measurements and a mix in, a plan out.

Why: on a few GPUs, whole replicas collapse a table to one config (one replica of each of two configs on
one GPU is not possible), yet greedy and sampled traffic want different configs at every load. Engines
that share a GPU split its time: if the GPU's time goes where the work is, a mix whose part ``p`` has a
share ``t_p`` of the output tokens and is served by a config making ``r_p`` tok/s on a GPU of its own
runs at ``1 / sum_p(t_p / r_p)`` tok/s per GPU (``r_p`` at the load the engine holds, below), i.e. ``1 / sum_k(w_k)`` with ``w_k`` the GPU-seconds per
token of the mix config ``k`` serves, where whole replicas give ``1 / max_k(w_k / n_k)``.

Engines on one GPU hold only their part of the requests in flight, and their time slices do not overlap:
served on one H100 (``benchmarks/results/gpu_shared_gpu_h100_2026-12-06``), the plan's two engines took
0.99x the time of their halves run one after the other, and each ran at its rate *at half the load*. So a
config's rate on a part is read at the in-flight its engine holds there, ``level x`` its share of that
level's tokens, interpolated log-log between the load levels the sweep measured for that bucket and band,
and bounded from below outside them (:func:`rate_at`). Reading every engine at the full level instead (what the first version of this module
did) predicted 1.2x where the GPU gave 0.81x: the batch an engine gives up is worth more than the
speculation it gains, for a memory-bound decode whose batch is nearly free. Memory must fit in full: each
engine's weights plus its KV cache, its memory fraction taken of the memory its own weights leave free
(LMDeploy's ``--cache-max-entry-count`` when it starts alone; engines that start at the same moment each
see the whole GPU free), added over the engines and held to one GPU.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

from orchestrator.errors import ConfigError
from tuning.choose.cells import CellMeasurement
from tuning.choose.mix import mix_parts
from tuning.choose.replicas import MAX_CONFIGS
from tuning.stats import PooledNoise

__all__ = ["EngineFootprint", "SharedGpuFitError", "SharedGpuPlan", "check_fits_one_gpu", "plan_shared_gpu", "rate_at"]

Part = tuple[str, str, int]
"""(bucket, sampling band, load level)."""


class SharedGpuFitError(ConfigError):
    """Engines planned to share one GPU do not fit its memory together."""


@dataclass(frozen=True)
class EngineFootprint:
    """One engine's GPU memory in GB on a GPU of ``gpu_gb``: what it holds whatever its memory fraction
    (``weights_gb``: weights, MTP head, reserved memory, per-sequence states) and its KV cache."""

    weights_gb: float
    kv_gb: float
    gpu_gb: float

    def __post_init__(self) -> None:
        if min(self.weights_gb, self.kv_gb) < 0 or self.gpu_gb <= 0:
            raise ValueError(f"footprint {self}: weights and KV must be >= 0 GB, the GPU > 0 GB")

    @property
    def total_gb(self) -> float:
        return self.weights_gb + self.kv_gb


def check_fits_one_gpu(footprints: Mapping[str, EngineFootprint], labels: Mapping[str, str] | None = None) -> None:
    """Raise :class:`SharedGpuFitError` unless the engines of ``footprints`` (engine key -> footprint, all
    measured on the same GPU) fit one GPU's memory together, naming each engine's weights and KV."""
    if not footprints:
        raise ValueError("no engine to place on the GPU")
    gpus = {f.gpu_gb for f in footprints.values()}
    if len(gpus) > 1:
        raise SharedGpuFitError(f"the engines' footprints were measured on GPUs of {sorted(gpus)} GB; "
                                "engines share a GPU only when all were measured on one kind")
    gpu = gpus.pop()
    need = sum(f.total_gb for f in footprints.values())
    if need > gpu + 1e-9:
        names = dict(labels or {})
        each = ", ".join(f"{names.get(k, k)} {f.weights_gb:.1f} GB weights + {f.kv_gb:.1f} GB KV"
                         for k, f in sorted(footprints.items()))
        raise SharedGpuFitError(
            f"{len(footprints)} engines do not fit one GPU of {gpu:.0f} GB together: {each} = {need:.1f} GB, "
            f"{need - gpu:.1f} GB over. Lower their memory fractions (--memory-fraction), or serve them on "
            "whole GPUs (without --share-gpu)")


def rate_at(points: Sequence[tuple[int | float, float]], in_flight: float) -> float | None:
    """The rate at ``in_flight`` from ``(in flight, rate)`` points measured at several loads: the measured
    one where it was measured, log-log between its neighbours inside their range, and outside it the
    bound a batched decode cannot fall below: below the lowest load the rate in proportion to the load
    (each sequence no slower than in the larger batch), above the highest the highest's rate (a larger
    batch makes no less). Both bounds understate what an engine holding part of the load makes, so a plan
    proposed on them pays at least as predicted. ``None`` without a point."""
    pts = sorted((float(x), r) for x, r in points if x > 0 and r > 0)
    if not pts or in_flight <= 0:
        return None
    if in_flight <= pts[0][0]:
        return pts[0][1] * in_flight / pts[0][0]
    for (x0, r0), (x1, r1) in zip(pts, pts[1:]):
        if x0 < in_flight <= x1:
            return math.exp(math.log(r0) + math.log(in_flight / x0) / math.log(x1 / x0) * math.log(r1 / r0))
    return pts[-1][1]


@dataclass(frozen=True)
class SharedGpuPlan:
    """The best set of engines to time-share each of ``gpus`` GPUs (one replica of each engine per GPU),
    the part of the mix each serves, the mix's predicted output tok/s on them (``rate``), the best single
    config on the same GPUs (``single``), the ratio's interval at the sweep's noise (``None`` without
    rounds), and whether the plan is proposed (``proposed``; ``reason`` says why or why not)."""

    routes: Mapping[Part, str]
    work: Mapping[str, float]
    gpus: int
    rate: float
    single: tuple[str, float]
    interval: tuple[float, float, float] | None
    proposed: bool
    reason: str

    @property
    def engines(self) -> tuple[str, ...]:
        return tuple(sorted(self.work))

    @property
    def ratio(self) -> float:
        return self.rate / self.single[1]


def plan_shared_gpu(measurements: Sequence[CellMeasurement], token_shares: Mapping[tuple[str, str], float], *,
                    in_flight: int | Mapping[int, float], footprints: Mapping[str, EngineFootprint], gpus: int = 1,
                    noise: PooledNoise | None = None, min_gain: float = 0.0, level: float = 0.95,
                    labels: Mapping[str, str] | None = None) -> SharedGpuPlan | None:
    """The time-shared plan for the mix ``token_shares`` x ``in_flight`` (as
    :func:`tuning.choose.mix.predict_mix` takes them) on ``gpus`` GPUs, from the configs that have a
    footprint (``footprints``: engine key -> its measured memory; a config without one is never placed
    beside another).

    Every set of at most :data:`~tuning.choose.replicas.MAX_CONFIGS` such configs that fits one GPU
    (:func:`check_fits_one_gpu`) and has a rate on every part is tried, each part served by the set's
    fastest config there; the fastest set wins (fewer configs at equal rates). It is proposed only when it
    holds several configs and beats the best single config on the same GPUs by more than ``min_gain`` and
    beyond the noise: with the sweep's pooled ``noise``, the ``level`` interval of the ratio (its rounds and
    engine starts those of the fewest-measured part on each side, :meth:`PooledNoise.ratio_bounds`) lies
    above 1. ``None`` when no single config was measured on every part of the mix."""
    shares = mix_parts(token_shares, in_flight)
    by_part: dict[Part, dict[str, CellMeasurement]] = {}
    for m in measurements:
        by_part.setdefault((m.bucket, m.band, m.in_flight), {})[m.engine_key] = m
    rate = {(k, p): m.figures(level).output_throughput for p, ms in by_part.items() for k, m in ms.items()}
    names = dict(labels or {})

    def served(keys: Sequence[str]) -> dict[Part, str] | None:
        routes = {}
        for p in shares:
            here = [k for k in keys if rate.get((k, p), 0) > 0]
            if not here:
                return None
            routes[p] = max(here, key=lambda k: (rate[(k, p)], k))
        return routes

    curves: dict[tuple[str, str, str], list[tuple[int, float]]] = {}
    for (k, (bucket, band, load)), r in rate.items():
        curves.setdefault((k, bucket, band), []).append((load, r))
    level_share: dict[int, float] = {}
    for (_, _, load), t in shares.items():
        level_share[load] = level_share.get(load, 0.0) + t

    def work_of(routes: Mapping[Part, str]) -> dict[str, float]:
        """GPU-seconds per token of the mix per engine, each part at the load its engine holds there."""
        held: dict[tuple[str, int], float] = {}
        for (bucket, band, load), k in routes.items():
            held[(k, load)] = held.get((k, load), 0.0) + shares[(bucket, band, load)] / level_share[load]
        work: dict[str, float] = {}
        for p, k in routes.items():
            r = rate_at(curves[(k, p[0], p[1])], p[2] * held[(k, p[2])])
            assert r is not None  # the part was measured on k (served() routes only there)
            work[k] = work.get(k, 0.0) + shares[p] / r
        return work

    singles = [(k, gpus / work_of(r)[k]) for k in sorted({k for k, _ in rate}) if (r := served([k])) is not None]
    if not singles:
        return None
    single = max(singles, key=lambda kv: (kv[1], kv[0]))
    best_routes, best_rate = served([single[0]]), single[1]
    assert best_routes is not None
    shareable = sorted(k for k in footprints if any(kk == k for kk, _ in rate))
    for n in range(2, min(MAX_CONFIGS, len(shareable)) + 1):
        for keys in combinations(shareable, n):
            routes = served(keys)
            if routes is None or len(set(routes.values())) < n:  # a config no part goes to: the smaller set's plan
                continue
            try:
                check_fits_one_gpu({k: footprints[k] for k in keys})
            except SharedGpuFitError:
                continue
            work = work_of(routes)
            r = gpus / sum(work.values())
            if r > best_rate * (1 + 1e-9):
                best_routes, best_rate = routes, r
    work = work_of(best_routes)
    ratio = best_rate / single[1]
    if len(work) == 1:
        return SharedGpuPlan(best_routes, work, gpus, best_rate, single, None, False,
                             "no set of several configs that fits one GPU beats the best single config")

    def weakest(routes: Mapping[Part, str]) -> CellMeasurement:
        return min((by_part[p][k] for p, k in routes.items()), key=lambda m: (len(m.throughputs), m.starts))

    interval = None
    if noise is not None:
        mine, theirs = weakest(best_routes), weakest(served([single[0]]) or {})
        interval = noise.ratio_bounds(ratio, (len(mine.throughputs), len(theirs.throughputs)), level,
                                      starts=(mine.starts, theirs.starts))
    shown = interval[1] > 1.0 if interval is not None else True
    proposed = shown and ratio > 1.0 + min_gain
    said = (f"{', '.join(names.get(k, k) for k in sorted(work))} time-sharing {'each of ' if gpus > 1 else ''}"
            f"{gpus} GPU{'s' if gpus > 1 else ''}: {best_rate:,.0f} tok/s vs {names.get(single[0], single[0])} alone "
            f"{single[1]:,.0f} ({ratio:.2f}x"
            + (f", {round(level * 100, 6):g} % {interval[1]:.2f}-{interval[2]:.2f}" if interval is not None else "")
            + ")")
    if proposed:
        reason = f"{said}: proposed"
    elif not shown:
        reason = f"{said}: not shown above it at the sweep's noise; one config"
    else:
        reason = f"{said}: not more than {min_gain:.0%} better; one config"
    return SharedGpuPlan(best_routes, work, gpus, best_rate, single, interval, proposed, reason)
