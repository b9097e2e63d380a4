"""When two measured configs are told apart: a row's interval over its rounds, and the noise of one
round and of one engine start pooled over the whole sweep.

Why: a table that routes to a second config for a difference its own rounds cannot tell from noise
costs an engine for nothing; every comparison in :mod:`tuning.choose` goes through these rules.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from tuning.results import STATUS_OK, is_cached_copy, repeat_throughputs
from tuning.stats import PooledNoise, mean_confidence_interval

__all__ = ["pooled_noise", "throughput_interval", "within_noise"]


def throughput_interval(row: Mapping[str, Any]) -> tuple[float, float] | None:
    """The 95 % confidence interval of a row's output throughput over its rounds (``--repeats``), low
    end clipped at 0; ``None`` for a row measured once."""
    runs = repeat_throughputs(row)
    if len(runs) < 2:
        return None
    _, low, high = mean_confidence_interval(runs)
    return max(low, 0.0), high


def within_noise(a: Mapping[str, Any], b: Mapping[str, Any], noise: PooledNoise | None = None) -> bool:
    """Neither row is shown better than the other. With the sweep's pooled ``noise``: the interval of
    their throughput ratio holds 1. Without: both have intervals over rounds and they overlap. Rows
    measured once, with no pooled noise, are never within noise of each other (their point figures rank
    them, as the sweep always did); measure with ``--repeats`` for the ranking to respect the noise."""
    if noise is not None:
        return not noise.different(repeat_throughputs(a), repeat_throughputs(b))
    ia, ib = throughput_interval(a), throughput_interval(b)
    return ia is not None and ib is not None and ia[0] <= ib[1] and ib[0] <= ia[1]


def pooled_noise(rows: pd.DataFrame) -> PooledNoise | None:
    """The noise of one round, and of one engine start where a config was measured on a cell by several,
    pooled over every successful row measured in rounds (``None``: none was). A row's rounds are one
    start's (its trial's engine); a cached copy adds nothing (:func:`is_cached_copy`). The start contrasts
    are counted per config (k starts: k - 1, however many cells they measured), since a start may shift
    all its cells alike."""
    ok = rows[(rows["status"] == STATUS_OK) & rows["output_throughput"].notna()] if not rows.empty else rows
    measurements: dict[tuple[Any, ...], dict[str, list[float]]] = {}
    starts: dict[Any, set[str]] = {}
    for r in ok.to_dict("records"):
        if is_cached_copy(r):
            continue
        t = r.get("temperature")
        cell = (r.get("engine_key"), r.get("bucket"), r.get("concurrency"), None if pd.isna(t) else float(t))
        measurements.setdefault(cell, {}).setdefault(str(r.get("trial_id")), repeat_throughputs(r))
        starts.setdefault(r.get("engine_key"), set()).add(str(r.get("trial_id")))
    return PooledNoise.of_starts([list(m.values()) for m in measurements.values()],
                                 contrasts=sum(len(s) - 1 for s in starts.values()))
