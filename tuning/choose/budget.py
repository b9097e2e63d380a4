"""Fitting a table to a GPU budget (``--serve-gpus``): which candidates each bucket may take, the
combination of primaries that fits and scores best, the cells that still fit, and what
to say when nothing does.

Why: a table that needs more GPUs than the user has cannot be deployed; the budget is checked with one
replica of every engine the table uses (:meth:`orchestrator.table.GpuBudget.fits`).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator import table as routing
from orchestrator.config import EngineConfig
from orchestrator.table import BucketRoute, GpuBudget
from tuning.buckets import Bucket
from tuning.choose.rank import engine_of_row, log_throughput

__all__ = ["BUDGET_CANDIDATES", "CELL_DROPPED", "fit_cells", "fit_primaries", "gpus_of",
           "no_fit_message"]


BUDGET_CANDIDATES = 5
"""Under a GPU budget, the configs a bucket may be given: its own best few (eligible, at its primary
load), plus any other bucket's best few that were measured eligible on it too, since an engine that
serves two buckets costs its GPUs once."""


CELL_DROPPED = "GPU(s); dropped"
"""How the budget-fitting step's note on a dropped cell ends. A replica plan made afterwards re-decides
every part of the mix from all measured configs, so its own notes supersede these
(:func:`tuning.choose.plan.plan_replicas` leaves them out)."""


def fit_primaries(ranked: Sequence[Sequence[dict[str, Any]]], budget: GpuBudget) -> list[dict[str, Any]] | None:
    """Per bucket one of its candidate rows such that one engine per distinct config fits ``budget``,
    maximising the sweep's scalar objective (mean over buckets of log output throughput); ties ->
    fewer distinct engines, then the better-ranked candidates. ``None`` when no combination fits.

    Depth-first over the buckets with each bucket's options best first, so the first complete
    combination is the unconstrained best; a branch is cut when even the best options of the
    remaining buckets cannot beat the best fitting combination, or when the reservations alone
    (their sum) exceed the budget: a lower bound of any packing, so no cut loses a fitting
    combination (FFD itself is not monotone and is only asked of complete combinations).
    """
    top = {r["engine_key"] for rows in ranked for r in rows[:BUDGET_CANDIDATES]}
    options = [[r for i, r in enumerate(rows) if i < BUDGET_CANDIDATES or r["engine_key"] in top] for rows in ranked]
    engines = {r["engine_key"]: engine_of_row(r) for rows in options for r in rows}
    reserve = {k: cfg.gpu_request(share_gpu=budget.share_gpu) for k, cfg in engines.items()}
    tail = [0.0] * (len(options) + 1)  # best attainable score of buckets i..end
    for i in range(len(options) - 1, -1, -1):
        tail[i] = tail[i + 1] + log_throughput(options[i][0])
    best: tuple[tuple[float, int], list[dict[str, Any]]] | None = None

    def visit(i: int, chosen: list[dict[str, Any]], score: float) -> None:
        nonlocal best
        if i == len(options):
            keys = {r["engine_key"] for r in chosen}
            rank = (score, -len(keys))
            if (best is None or rank > best[0]) and budget.fits(engines[k] for k in keys):
                best = (rank, list(chosen))
            return
        for row in options[i]:
            s = score + log_throughput(row)
            if best is not None and s + tail[i + 1] < best[0][0]:
                break  # options are best first: the rest of this bucket's can only do worse
            keys = {r["engine_key"] for r in chosen} | {row["engine_key"]}
            if sum(reserve[k] for k in keys) > budget.gpus + 1e-9:
                continue
            visit(i + 1, [*chosen, row], s)

    visit(0, [], 0.0)
    return None if best is None else best[1]


def fit_cells(routes: list[BucketRoute], budget: GpuBudget) -> tuple[list[BucketRoute], list[str]]:
    """Drop cells, least gain first, until one replica of every engine fits the budget."""
    notes: list[str] = []

    def configs() -> list[EngineConfig]:
        return list({c.key(): c for r in routes for c in r.engine_configs()}.values())

    while not budget.fits(configs()):
        candidates = [(c.gain() if c.gain() is not None else 0.0, i, j) for i, r in enumerate(routes)
                      for j, c in enumerate(r.cells)]
        if not candidates:
            break
        _, i, j = min(candidates)
        cell = routes[i].cells[j]
        notes.append(f"{routes[i].name} cell {cell.label}: "
                     f"{cell.engine_config().label()} does not fit {budget.gpus} {CELL_DROPPED}")
        routes[i] = routes[i].model_copy(update={"cells": routes[i].cells[:j] + routes[i].cells[j + 1:]})
    return routes, notes


def gpus_of(rows: Sequence[Mapping[str, Any]], budget: GpuBudget) -> int:
    """GPUs one engine per distinct config of ``rows`` takes under the budget's sharing."""
    return routing.gpus_for_engines({r["engine_key"]: engine_of_row(r) for r in rows}.values(), share_gpu=budget.share_gpu)


def no_fit_message(found: Sequence[tuple[Bucket, Any, Sequence[Mapping[str, Any]], Any]], budget: GpuBudget) -> str:
    best = [ranked[0] for _, _, ranked, _ in found]
    smallest = min((r for _, _, ranked, _ in found for r in ranked[:BUDGET_CANDIDATES]),
                   key=lambda r: engine_of_row(r).gpu_request(share_gpu=budget.share_gpu))
    shareable = any(engine_of_row(r).tp == 1 for _, _, ranked, _ in found for r in ranked)
    return (
        f"no routing table of the measured configs fits {budget.gpus} GPU(s)"
        f"{' with tp=1 engines sharing GPUs' if budget.share_gpu else ''}, so no routing table was written and "
        f"any previous table is kept: the best config per bucket needs {gpus_of(best, budget)} GPUs and no "
        f"combination of each bucket's top {BUDGET_CANDIDATES} eligible configs fits (the smallest, "
        f"{smallest['engine_label']}, reserves {engine_of_row(smallest).gpu_request(share_gpu=budget.share_gpu):g} GPUs "
        f"alone).\nRaise --serve-gpus, "
        + ("let tp=1 engines share GPUs (--share-gpu), " if shareable and not budget.share_gpu else "")
        + ("or sweep smaller memory fractions." if budget.share_gpu else "or sweep a lower --tp.")
    )
