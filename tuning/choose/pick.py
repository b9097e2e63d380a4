"""The routing table from a results frame (:func:`pick_best`): each bucket's primary, its cells (sampling
band x load level), both baselines and the gains over them, fitted to a GPU budget when there is one.

Pure: no files, no clock. An incomplete sweep (a bucket without a successful trial, a baseline missing)
raises :class:`IncompleteResultsError` *before* anything is committed, so a good table already at the
target path stays.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from orchestrator.table import (
    BucketFigures,
    BucketRoute,
    GpuBudget,
    Provenance,
    RoutingTable,
    RoutingTableError,
)
from tuning.buckets import Bucket
from tuning.choose.budget import (
    fit_cells,
    fit_primaries,
    gpus_of,
    no_fit_message,
)
from tuning.choose.cells import CELL_MIN_GAIN, bucket_cells
from tuning.choose.constraints import NO_CONSTRAINTS, Constraints
from tuning.choose.figures import gains_over, row_figures
from tuning.choose.noise import pooled_noise, within_noise
from tuning.choose.rank import (
    at_temperature,
    best_row,
    consolidate,
    describe_row,
    engine_of_row,
    log_throughput,
    ranked_rows,
)
from tuning.results import STATUS_OK, config_of_row, repeat_throughputs
from tuning.sweep.space import BASELINE_ROLES

__all__ = ["IncompleteResultsError", "pick_best"]


class IncompleteResultsError(RoutingTableError):
    """The sweep's results can't make a complete routing table; the previous table is kept."""


def pick_best(
    results: pd.DataFrame,
    buckets: Sequence[Bucket],
    constraints: Constraints = NO_CONSTRAINTS,
    *,
    provenance: Provenance,
    budget: GpuBudget | None = None,
    cell_min_gain: float = CELL_MIN_GAIN,
) -> RoutingTable:
    """Per bucket, the config with the highest measured output throughput at the bucket's primary load
    among successful rows that meet ``constraints``; its figures; both baselines' figures and the
    gains over them; and its cells (:func:`tuning.choose.cells.choose_cells`): every other (sampling band,
    concurrency) whose best config beats the one it would otherwise get beyond the noise and by more than
    ``cell_min_gain`` (a bucket measured at one temperature gets load cells that hold for every band, as
    its primary does); cells that do not fit the budget are dropped, least gain first. The noise: one
    round's, pooled over every row measured
    in rounds (:func:`~tuning.choose.noise.pooled_noise`); two configs differ where the interval of their ratio excludes 1.
    A cell left on the bucket's config because its comparison was within noise is named in
    ``provenance.notes`` with the rounds that would decide it: a second sweep may decide it otherwise.

    With a ``budget`` the table must also be servable on ``budget.gpus`` GPUs (one replica of every
    engine it uses, sharing per ``budget.share_gpu``): the per-bucket best when that fits; else the
    fitting combination of each bucket's top candidates that maximises the sweep's scalar objective
    (:func:`fit_primaries`). What the budget changed is written to ``provenance.gpu_budget.notes``.

    Pure: no files, no clock. Raises :class:`IncompleteResultsError` naming what is missing when a
    bucket has no eligible successful row or a baseline has no successful row for a bucket, or when
    no combination fits the budget.
    """
    problems: list[str] = []
    if results.empty:
        raise IncompleteResultsError("the sweep produced no results; nothing to route by (previous table kept)")
    ok = results[(results["status"] == STATUS_OK) & results["output_throughput"].notna()]
    found: list[tuple[Bucket, dict[str, BucketFigures], list[dict[str, Any]], pd.DataFrame]] = []
    for b in buckets:
        at_bucket = ok[ok["bucket"] == b.name]
        at_t = at_temperature(at_bucket, b.primary_temperature)
        primary = at_t[at_t["concurrency"] == b.primary_concurrency]
        baselines: dict[str, BucketFigures] = {}
        for role, key in BASELINE_ROLES.items():
            base = best_row(primary[primary["role"] == role])
            if base is None:
                problems.append(f"bucket {b.name}: baseline {key!r} ({role}) has no successful measurement")
            else:
                baselines[key] = row_figures(base)
        ranked = ranked_rows(primary[constraints.mask(primary)] if not primary.empty else primary)
        if not ranked:
            why = "no successful trial" if primary.empty else f"no successful trial meets {constraints.to_dict()}"
            problems.append(f"bucket {b.name}: {why}")
            continue
        found.append((b, baselines, ranked, at_bucket))
    if problems:
        raise IncompleteResultsError(
            "the sweep's results are incomplete, so no routing table was written and any previous table is "
            "kept:\n  - " + "\n  - ".join(problems)
            + "\nResume the sweep (--resume RUN_DIR) with a larger --num-trials/--time-budget-s, relax the "
            "constraints, or check the failure reasons in results.csv."
        )

    # Called different only when their intervals say so: within noise of its best, a bucket takes the
    # config that serves the most buckets (when no row of the sweep has rounds: the point figure decides).
    noise = pooled_noise(results)
    unconstrained = consolidate([ranked for _, _, ranked, _ in found], noise)
    chosen = unconstrained
    notes: list[str] = []
    if budget is not None and not budget.fits(engine_of_row(r) for r in {r["engine_key"]: r for r in chosen}.values()):
        fitted = fit_primaries([ranked for _, _, ranked, _ in found], budget)
        if fitted is None:
            raise IncompleteResultsError(no_fit_message(found, budget))
        chosen = fitted
        for (b, *_), best, row in zip(found, unconstrained, chosen):
            if row["engine_key"] != best["engine_key"]:
                notes.append(f"{b.name}: {describe_row(row)} instead of {describe_row(best)} "
                             f"({float(row['output_throughput']) / float(best['output_throughput']) - 1:+.1%})")
        if notes:
            ratio = math.exp((sum(map(log_throughput, chosen)) - sum(map(log_throughput, unconstrained))) / len(chosen))
            notes.insert(0, f"the best config per bucket needs {gpus_of(unconstrained, budget)} GPUs, over the "
                            f"budget of {budget.gpus}; this table's geometric-mean output throughput over the "
                            f"buckets is {ratio - 1:+.1%} against it")
    within = [f"{b.name}: {describe_row(row)} serves it, within noise of {describe_row(ranked[0])} "
              f"({float(row['output_throughput']) / float(ranked[0]['output_throughput']) - 1:+.1%}; "
              + ("the interval of their ratio holds 1 at the pooled noise)" if noise else
                 f"intervals over {len(repeat_throughputs(row))} rounds overlap)")
              for (b, _, ranked, _), row in zip(found, chosen)
              if row["engine_key"] != ranked[0]["engine_key"] and within_noise(row, ranked[0], noise)]
    if noise is not None:
        within.insert(0, f"noise: {noise.describe()} over the sweep's measurements; two configs are called "
                         "different where the 95 % interval of their throughput ratio excludes 1")
    routes = []
    for (b, baselines, _, at_bucket), row in zip(found, chosen):
        figures = row_figures(row)
        choice = bucket_cells(b, at_bucket, row["engine_key"], constraints, cell_min_gain, noise)
        within.extend(f"{b.name} {n}" for n in choice.notes)  # an undecided cell: a second sweep may differ
        routes.append(BucketRoute(
            name=b.name, max_output_len=b.max_output_len, config=config_of_row(row), figures=figures,
            baselines=baselines, gains=gains_over(figures, baselines), cells=choice.cells,
            workload=b.workload.to_dict(),
        ))
    if budget is not None:
        routes, dropped = fit_cells(routes, budget)
        notes.extend(dropped)
    update: dict[str, Any] = {"constraints": constraints.to_dict(), "notes": tuple(within)}
    if budget is not None:
        update["gpu_budget"] = budget.model_copy(update={"notes": tuple(notes)})
    return RoutingTable(provenance=provenance.model_copy(update=update), buckets=tuple(routes),
                        default_max_tokens=buckets[0].max_output_len)
