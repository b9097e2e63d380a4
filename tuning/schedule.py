"""vLLM's dynamic speculation schedule from the sweep's load cells. Pure.

vLLM 0.26.0 changes the draft length inside one engine as its batch grows: ``--speculative-config``'s
``num_speculative_tokens_per_batch_size``, a list of ``[first batch size, last batch size, draft
tokens]`` (vllm-project/vllm#32374). It ships no default because the right one depends on the model
and the GPU; targeting an acceptance rate cannot find it either (acceptance stays flat with load while
the right action flips from "speculate" to "off"). Measured throughput per draft length per load can,
and that is what the sweep's load cells are: config x in-flight level.

So for one vLLM engine (every field but the draft length fixed), one output-length bucket and one
temperature class, :func:`draft_schedule` takes the throughput of each draft length (0 = MTP off) at
each in-flight level and returns the ranges: per level the best draft length, where the draft length
already serving the neighbouring level is kept when it measured within noise of the best (two figures
are within noise when they differ by no more than the larger of ``min_gain`` and either's run-to-run
spread), and neighbouring levels with the same draft length merged. Level ``c_i`` covers the batch
sizes from just above the previous level's range to ``floor(sqrt(c_i * c_{i+1}))`` (the geometric
middle: levels are measured on a log-like grid), the last one up to the engine's ``max_num_seqs``.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.backends.vllm import check_draft_schedule
from orchestrator.config import EngineConfig
from orchestrator.errors import ConfigError

__all__ = ["DraftSchedule", "LoadPoint", "MIN_GAIN", "draft_schedule", "load_points", "schedule_lines", "schedule_table"]

MIN_GAIN = 0.03
"""A draft length replaces the one serving the neighbouring level only when it is more than this much
faster (the sweep's cell rule: a cell beats what it would otherwise get by more than 3 %)."""


@dataclass(frozen=True)
class LoadPoint:
    """One load cell of one engine: ``draft_tokens`` (0 = MTP off) measured at ``in_flight``."""

    in_flight: int
    draft_tokens: int
    throughput: float
    spread: float = 0.0
    """Run-to-run spread of the figure, relative ((max - min) / median of the rounds)."""

    def __post_init__(self) -> None:
        if self.in_flight < 1 or self.draft_tokens < 0 or not self.throughput >= 0 or not self.spread >= 0:
            raise ConfigError(f"invalid load point {self}: in_flight >= 1, draft_tokens >= 0, throughput and "
                              "spread >= 0")


@dataclass(frozen=True)
class DraftSchedule:
    """``ranges``: ``(first batch size, last batch size, draft tokens)``, contiguous from 1, in order."""

    ranges: tuple[tuple[int, int, int], ...]

    def __post_init__(self) -> None:
        if not self.ranges:
            raise ConfigError("a draft schedule needs at least one range")
        longest = max((int(r[2]) for r in self.ranges), default=0)
        object.__setattr__(self, "ranges", check_draft_schedule(self.ranges, max(longest, 0)))

    @property
    def num_speculative_tokens(self) -> int:
        """The engine's draft length: the schedule's longest (vLLM sizes its buffers by it)."""
        return max(k for _, _, k in self.ranges)

    def draft_tokens_at(self, batch_size: int) -> int:
        """The draft length at ``batch_size`` running sequences (past the last range: the last one's)."""
        for lo, hi, k in self.ranges:
            if lo <= batch_size <= hi:
                return k
        return self.ranges[-1][2]

    def to_vllm(self) -> list[list[int]]:
        """``num_speculative_tokens_per_batch_size`` as vLLM's JSON takes it."""
        return [list(r) for r in self.ranges]

    def apply_to(self, config: EngineConfig) -> EngineConfig:
        """``config`` (one vLLM engine, any draft length) serving this schedule: MTP with the longest draft
        length and the ranges, or MTP off where the schedule never drafts."""
        if self.num_speculative_tokens == 0:
            return config.replace(speculative_algorithm=None, num_draft_tokens=0, draft_schedule=None)
        if len(self.ranges) == 1:  # one draft length everywhere: a fixed engine, no schedule to pass
            return config.replace(speculative_algorithm="qwen3_5_mtp", num_draft_tokens=self.num_speculative_tokens,
                                  draft_schedule=None)
        return config.replace(speculative_algorithm="qwen3_5_mtp", num_draft_tokens=self.num_speculative_tokens,
                              draft_schedule=self.ranges)


def draft_schedule(points: Iterable[LoadPoint], *, max_batch_size: int | None = None,
                   min_gain: float = MIN_GAIN) -> DraftSchedule:
    """The schedule the measured ``points`` of one engine ask for (module docstring).

    Args:
        points: every (in-flight level, draft length) measured; each level needs at least one.
        max_batch_size: the engine's ``max_num_seqs``: where the last range ends (default: the highest
            level measured).
        min_gain: the smallest relative gain that moves a level off its neighbour's draft length.
    Raises:
        ConfigError: no points, or two figures for the same (level, draft length).
    """
    by_level: dict[int, dict[int, LoadPoint]] = {}
    for p in points:
        level = by_level.setdefault(p.in_flight, {})
        if p.draft_tokens in level:
            raise ConfigError(f"two measurements of {p.draft_tokens} draft tokens at {p.in_flight} in flight; "
                              "pass one figure per load cell")
        level[p.draft_tokens] = p
    if not by_level:
        raise ConfigError("a draft schedule needs measured load points")
    levels = sorted(by_level)
    tied = [_within_noise(by_level[c], min_gain) for c in levels]
    chosen: list[int] = []
    for i, candidates in enumerate(tied):
        if chosen and chosen[-1] in candidates:
            chosen.append(chosen[-1])  # the neighbour's draft length is as good here: one range
            continue
        # among the draft lengths as good as the best, the one that stays so over the most levels ahead
        chosen.append(max(candidates, key=lambda k: (_run_length(tied, i, k), by_level[levels[i]][k].throughput)))
    last = max(max_batch_size or 0, levels[-1])
    bounds = [math.isqrt(a * b) for a, b in zip(levels, levels[1:])] + [last]
    ranges: list[tuple[int, int, int]] = []
    lo = 1
    for hi, k in zip(bounds, chosen):
        hi = max(hi, lo)
        if ranges and ranges[-1][2] == k:
            ranges[-1] = (ranges[-1][0], hi, k)
        else:
            ranges.append((lo, hi, k))
        lo = hi + 1
    return DraftSchedule(tuple(ranges))


def _within_noise(level: Mapping[int, LoadPoint], min_gain: float) -> frozenset[int]:
    best = max(level.values(), key=lambda p: p.throughput)
    return frozenset(k for k, p in level.items()
                     if p.throughput >= best.throughput / (1 + max(min_gain, p.spread, best.spread)))


def _run_length(tied: Sequence[frozenset[int]], start: int, k: int) -> int:
    n = 0
    for candidates in tied[start:]:
        if k not in candidates:
            break
        n += 1
    return n


def load_points(rows: Iterable[Mapping[str, Any]]) -> list[LoadPoint]:
    """Load points from results rows (:data:`tuning.results.ROW_COLUMNS`) of one engine, bucket and
    temperature class: ``concurrency``, ``num_draft_tokens`` (0 when ``speculative`` is off),
    ``output_throughput`` and ``output_throughput_spread``; failed rows are left out."""
    out = []
    for r in rows:
        if r.get("status", "ok") != "ok":
            continue
        spread = r.get("output_throughput_spread")
        out.append(LoadPoint(in_flight=int(r["concurrency"]),
                             draft_tokens=int(r["num_draft_tokens"]) if r.get("speculative") else 0,
                             throughput=float(r["output_throughput"]),
                             spread=0.0 if spread is None or spread != spread else float(spread)))
    return out


# ----- the sweep's table -------------------------------------------------------------------------------
_DRAFT_FIELDS = ("speculative_algorithm", "num_draft_tokens", "draft_schedule")


def _engine_identity(config: Mapping[str, Any]) -> str:
    """A config without its draft length: one engine whatever it drafts (what a schedule varies)."""
    import json

    return json.dumps({k: v for k, v in config.items() if k not in _DRAFT_FIELDS}, sort_keys=True)


def schedule_table(table: Any, results: Any, *, min_gain: float = MIN_GAIN) -> Any:
    """``table`` with each bucket whose primary engine is vLLM (real or simulated) serving one engine with
    a draft schedule instead of several engines split by load (module docstring): the schedule comes
    from that engine's load cells at the bucket's primary temperature in ``results`` (a results frame);
    the bucket's cells on the same engine (any draft length) at that temperature's band
    are dropped, since the engine adapts by itself; cells on other engines or bands stay (the router
    still routes by temperature across engines where that pays). A bucket measured at one load level,
    or whose schedule is one draft length everywhere, is left as it was. Every scheduled bucket gets a
    provenance note: its figures stay those of the configs measured, the schedule itself was not."""
    from orchestrator.config import EngineConfig
    from tuning.results import config_of_row

    if results is None or len(results) == 0 or "engine" not in results.columns:
        return table
    ok = results[(results["status"] == "ok") & (results["engine"] == "vllm")]
    buckets, notes = [], list(table.provenance.notes)
    for bucket in table.buckets:
        primary = bucket.engine_config()
        rows = ok[ok["bucket"] == bucket.name]
        if primary.engine_name != "vllm" or rows.empty:
            buckets.append(bucket)
            continue
        at_primary = rows[rows["primary_load"].astype(bool)]
        if at_primary.empty:
            buckets.append(bucket)
            continue
        temperature = float(at_primary["temperature"].mode().iloc[0])
        identity = _engine_identity(primary.to_dict())
        mine = [r for r in rows[rows["temperature"] == temperature].to_dict("records")
                if _engine_identity(EngineConfig.from_dict(config_of_row(r)).to_dict()) == identity]
        points = _one_per_cell(load_points(mine))
        if len({p.in_flight for p in points}) < 2:
            buckets.append(bucket)
            continue
        schedule = draft_schedule(points, max_batch_size=primary.max_batch_size, min_gain=min_gain)
        if len(schedule.ranges) == 1:
            buckets.append(bucket)
            continue
        scheduled = schedule.apply_to(primary)
        band = table.band_for(temperature)
        band_name = band.name if band is not None else None
        same = lambda route: _engine_identity(route.config) == identity  # noqa: E731
        cells = tuple(c for c in bucket.cells if not (same(c) and c.sampling in (None, band_name)))
        buckets.append(bucket.model_copy(update={
            "config": scheduled.to_dict(), "cells": cells,
            "engine": None, "engine_version": None}))  # re-derived when the table is parsed
        notes.append(f"{bucket.name}: vLLM draft schedule {schedule.to_vllm()} from its load cells at temperature "
                     f"{temperature:g} (levels {sorted({p.in_flight for p in points})}); the figures are the "
                     "measured configs', the scheduled engine itself was not measured")
    return table.model_copy(update={"buckets": tuple(buckets),
                                    "provenance": table.provenance.model_copy(update={"notes": tuple(notes)})})


def _one_per_cell(points: list[LoadPoint]) -> list[LoadPoint]:
    """One figure per (level, draft length): the median of several engines' measurements of it (cached
    copies and decide rounds measure a cell again), with the widest spread among them."""
    import statistics

    cells: dict[tuple[int, int], list[LoadPoint]] = {}
    for p in points:
        cells.setdefault((p.in_flight, p.draft_tokens), []).append(p)
    return [LoadPoint(c, k, statistics.median(p.throughput for p in ps), max(p.spread for p in ps))
            for (c, k), ps in cells.items()]


def schedule_lines(table: Any) -> list[str]:
    """For the summary: the exact ``--speculative-config`` of every route that serves a draft schedule."""
    from orchestrator.backends.base import compact_json
    from orchestrator.backends.vllm import speculative_config

    out = []
    for bucket in table.buckets:
        for route in (bucket, *bucket.cells):
            config = route.engine_config()
            if config.draft_schedule is not None:
                out.append(f"{bucket.name}: --speculative-config '{compact_json(speculative_config(config))}'")
    return out
