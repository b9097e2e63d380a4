"""Ranking a bucket's measured configs: one row per config, best first, and the one config that
serves the most buckets among those within noise of each bucket's best.

Why: the table's primaries are chosen here; every later step (cells, the GPU budget, the replica
plan) starts from these rankings.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from orchestrator.config import EngineConfig
from orchestrator.table import BucketFigures
from tuning.buckets import Bucket
from tuning.choose.figures import row_figures
from tuning.choose.noise import within_noise
from tuning.results import STATUS_OK, config_of_row
from tuning.stats import PooledNoise

__all__ = ["at_temperature", "best_row", "consolidate", "describe_row", "engine_of_row", "log_throughput",
           "measured_at_primary", "ranked_rows"]


def ranked_rows(df: pd.DataFrame) -> list[dict[str, Any]]:
    """One row per engine config, best first: highest throughput; ties -> fewer draft tokens, then
    lower memory fraction (cheaper, safer)."""
    if df.empty:
        return []
    ordered = df.sort_values(["output_throughput", "num_draft_tokens", "memory_fraction"],
                             ascending=[False, True, True], kind="mergesort")
    return ordered.drop_duplicates("engine_key", keep="first").to_dict("records")


def best_row(df: pd.DataFrame) -> Mapping[str, Any] | None:
    ranked = ranked_rows(df)
    return ranked[0] if ranked else None


def log_throughput(row: Mapping[str, Any]) -> float:
    t = float(row["output_throughput"])
    return math.log(t) if t > 0 else -math.inf


def engine_of_row(row: Mapping[str, Any]) -> EngineConfig:
    return EngineConfig.from_dict(config_of_row(row))


def describe_row(row: Mapping[str, Any]) -> str:
    return f"{row['engine_label']} ({float(row['output_throughput']):,.0f} tok/s)"


def consolidate(ranked: Sequence[Sequence[dict[str, Any]]], noise: PooledNoise | None = None) -> list[dict[str, Any]]:
    """Per bucket one row among those within noise of its best (``ranked[i][0]`` and every row whose
    interval overlaps it), such that as few distinct configs as possible serve all buckets.

    Why: a table that routes bucket A to config X and bucket B to Y because X measured 2 % above Y on
    A costs a second engine for a difference its own rounds cannot tell from noise. Greedy cover: the
    config among the most buckets' ties first (ties -> higher mean log throughput over those buckets,
    then the better-ranked), its row for each of them; then the next, over the buckets left. A bucket
    whose best has no interval (one round, no pooled ``noise``) keeps its best."""
    ties = [[r for r in rows if r is rows[0] or within_noise(r, rows[0], noise)] for rows in ranked]
    chosen: list[dict[str, Any] | None] = [None] * len(ranked)
    left = set(range(len(ranked)))
    while left:
        covers: dict[str, list[dict[str, Any]]] = {}
        for i in sorted(left):
            for r in ties[i]:
                covers.setdefault(r["engine_key"], []).append(r)
        key = max(covers, key=lambda k: (len(covers[k]), sum(map(log_throughput, covers[k])) / len(covers[k])))
        for i in sorted(left):
            row = next((r for r in ties[i] if r["engine_key"] == key), None)
            if row is not None:
                chosen[i] = row
                left.discard(i)
    return [r for r in chosen if r is not None]


def at_temperature(df: pd.DataFrame, temperature: float) -> pd.DataFrame:
    """Rows measured at ``temperature`` (rows from before the column stand for the primary one)."""
    if "temperature" not in df.columns:
        return df
    t = pd.to_numeric(df["temperature"], errors="coerce")
    return df[t.isna() | (t == temperature)]


def measured_at_primary(results: pd.DataFrame, b: Bucket, engine_key: str) -> tuple[dict[str, Any], BucketFigures] | None:
    """``engine_key``'s config and figures at bucket ``b``'s primary cell (its primary load and
    temperature), from the successful rows of ``results``; ``None`` where it was not measured there."""
    ok = results[(results["status"] == STATUS_OK) & (results["engine_key"] == engine_key)
                 & (results["bucket"] == b.name)]
    at = at_temperature(ok, b.primary_temperature)
    row = best_row(at[at["concurrency"] == b.primary_concurrency])
    return None if row is None else (config_of_row(row), row_figures(row))
