"""Deciding what the sweep left undecided (``--decide-rounds R``).

A cell comparison within noise keeps the bucket's config: "not shown", not "the same". Where the true
gap is real but the rounds were too few to show it, a second sweep of the same space can show it and
commit another route, and tables of one space then differ on the mix by as much as that gap. With
``decide_rounds`` the sweep measures each such comparison again before it commits: both configs of every
undecided (bucket, sampling band, load) get fresh engines (``decide_starts``, below) and ``R`` more rounds
of those cells' temperatures x loads (a bucket whose undecided cells differ in both measures their cross
product); the rounds of both measurements are pooled (:func:`tuning.choose.cells.cell_measurements` merges
them) and the table is chosen again from all of it.

What the re-test costs in rigour: testing again at the same level after pooling raises the chance of
calling two equal configs different (about 6 % instead of 5 % at 95 %, 2 rounds then 2 + 4, simulated).

Several engine starts (``decide_starts K``): an engine start can shift every round it measures by a few
per cent, the same for all of them; the rounds of one engine then scatter around that start's level, not
the config's, and more rounds only pin that start down. Split over K fresh engines per config (``R / K``
rounds on each), a comparison holds K + 1 starts of each config. The pooled noise estimates the variation
between starts from every config measured by several (:class:`tuning.stats.PooledNoise` ``start_sd``;
already two with K = 1: the first trial's and the decide engine's) and every comparison carries it, so a
difference one lucky start made is not called real. The configs' engines start in alternation (A1, B1,
A2, B2, ...) so that a drift of the machine over the phase falls on all of them alike. Each start is a
Tune trial of its own (its own trial id, engine and logs; no result cache), so the rows of one config tell
its starts apart.

Passes (:func:`decide_phase`): once the starts are told apart, a comparison the first rounds showed on one
start per config can fall within noise. The phase plans again after each pass and measures those too, up
to :data:`MAX_DECIDE_PASSES` passes, each only comparisons no pass has measured.

:func:`tuning.choose.decision.plan_decision` is pure (results and the chosen table in, what to re-measure
out); :func:`run_decision` runs it as a second Tune experiment (``<run_dir>/decide``: its trial reports and
engine logs), under the sweep's measuring rules (burn-in, one measurement per GPU at a time).
"""
from __future__ import annotations

import dataclasses
import logging
import shutil
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from orchestrator.table import RoutingTableError
from tuning.buckets import Bucket
from tuning.choose.decision import ROLE_DECIDE, DecisionPlan, plan_decision
from tuning.results import STATUS_OK, repeat_throughputs
from tuning.sweep.budget import (
    BUDGET_FILE,
    read_budget,
    stop_reached,
    time_budget_spent,
)
from tuning.sweep.records import ResultRow

__all__ = ["DECIDE_DIR", "MAX_DECIDE_PASSES", "decide_phase", "earlier_rows", "run_decision", "sweep_rows"]

logger = logging.getLogger(__name__)

DECIDE_DIR = "decide"
MAX_DECIDE_PASSES = 3
"""Passes of the decide phase at most: a pass can leave a comparison within noise that the first rounds
had shown (below), and each later pass measures only comparisons no pass has measured yet."""


def _shortfall(plan: DecisionPlan, added: Sequence[ResultRow]) -> str:
    """What of the plan was not measured ('' when all of it was): the starts that reported measurements,
    the fewest and most rounds a start ran on its cells, and rows that failed, where the time budget, the
    hard limit or a failure cut the pass."""
    rounds: dict[str, int] = {}
    failed = 0
    for r in added:
        if r.status != STATUS_OK or r.output_throughput is None:
            failed += 1
            continue
        n = len(repeat_throughputs(r.to_dict()))
        rounds[r.trial_id] = min(rounds.get(r.trial_id, n), n)
    planned = plan.starts * len(plan.points)
    if len(rounds) == planned and not failed and all(n == plan.rounds_per_start for n in rounds.values()):
        return ""
    if not rounds:
        head = f"; none of {planned} starts measured"
    else:
        lo, hi = min(rounds.values()), max(rounds.values())
        span = f"{lo}-{hi}" if lo != hi else f"{hi}"
        head = f"; {len(rounds)} of {planned} starts, {span} of {plan.rounds_per_start} rounds each"
    return head + (f", {failed} row(s) failed" if failed else "")


def decide_phase(spec: Any, rows: list[ResultRow], results: Any,
                 measure: Callable[[Any, DecisionPlan], list[ResultRow]] | None = None,
                 ) -> tuple[list[ResultRow], Any, str | None]:
    """With ``spec.decide_rounds``: the cell comparisons the results leave within noise, and not measured
    again yet, measured again (``measure``, by default :func:`run_decision` on the Ray cluster), their rows
    added, and the results frame and note that say so (``None``: nothing to decide, or the results do not
    make a table yet). Planned again after each pass, up to :data:`MAX_DECIDE_PASSES`: the rounds of a pass
    on fresh engines can show the engine starts apart (:class:`tuning.stats.PooledNoise` ``start_sd``), and
    a comparison the first rounds showed on one start per config can then fall within noise; it is measured
    in the next pass, as the first pass's were. No engine starts after the time budget. A pass that fails
    leaves the results as they were, with a note saying why: the sweep's own measurements and table never
    depend on it."""
    from tuning.choose.table import pick_for
    from tuning.results import results_frame
    from tuning.sweep.provenance import provenance_for

    measure = measure or run_decision
    notes: list[str] = []
    planned: set[tuple[str, str, int]] = set()  # cells a pass measured, or tried to: never planned twice

    def plan_next(results: Any) -> DecisionPlan | None:
        first = pick_for(results, spec, provenance_for(spec, results))  # before the mix rules: see plan_decision
        return plan_decision(results, spec.buckets, first, spec.decide_rounds, spec.constraints,
                             starts=spec.decide_starts, exclude=planned)

    for _ in range(MAX_DECIDE_PASSES):
        try:
            plan = plan_next(results)
            if plan is None:
                break
            budget = read_budget(Path(spec.run_dir) / BUDGET_FILE)
            if time_budget_spent(budget) or stop_reached(budget):
                why = ("the hard limit (--stop-after-s) was reached" if stop_reached(budget)
                       else "the time budget was spent")
                notes.append(f"decide: {plan.describe()} wanted, not run: {why}")
                break
            planned.update((u.bucket, u.band, u.in_flight) for u in plan.undecided)
            print(f"decide: {plan.describe()} ...", file=sys.stderr, flush=True)  # engine starts: minutes on GPUs
            added = measure(spec, plan)
        except RoutingTableError:
            break
        except Exception as e:  # noqa: BLE001 - Ray, Tune and config errors alike: the tables so far still stand
            logger.exception("decide phase failed")
            notes.append(f"decide: failed ({type(e).__name__}: {str(e)[:300]}); the table is chosen from the rounds "
                         "measured before")
            break
        measured = sorted({r.engine_label or r.engine_key or "?" for r in added})
        notes.append(f"decide: {plan.describe()}; measured again: {', '.join(measured) or 'none'} ({len(added)} rows"
                     f"{_shortfall(plan, added)})")
        if not added:  # the results are as they were: nothing new to plan from
            break
        rows = [*rows, *added]
        results = results_frame(rows)
    else:
        try:
            left = plan_next(results)
        except RoutingTableError:
            left = None
        if left is not None:
            notes.append(f"decide: stopped after {MAX_DECIDE_PASSES} pass(es); still {left.describe()}, not measured")
    return rows, results, "; then ".join(notes) or None


def sweep_rows(rows: Sequence[ResultRow], buckets: Sequence[Bucket]) -> list[ResultRow]:
    """Decide rows as the sweep's own: off every bucket's primary cell (a cut-down bucket measures every
    temperature x load of its undecided cells, which can include the primary cell; a second row there would
    rank the config twice) and never its primary load (they were measured as a cut-down bucket's primary)."""
    by_name = {b.name: b for b in buckets}
    out = []
    for r in rows:
        b = by_name.get(r.bucket)
        if b is None or r.concurrency is None or r.temperature is None:
            continue
        if b.is_primary(int(r.concurrency), float(r.temperature)):
            continue
        out.append(dataclasses.replace(r, primary_load=False))
    return out


def earlier_rows(run_dir: str | Path, buckets: Sequence[Bucket]) -> list[ResultRow]:
    """The decide rows a run dir already holds (``<run_dir>/decide``): a resumed sweep keeps them."""
    from tuning.sweep.records import TrialReport, reported_trial_ids

    where = Path(run_dir) / DECIDE_DIR
    rows = [r for t in reported_trial_ids(where) if (rep := TrialReport.load(str(where), t)) is not None
            for r in rep.rows]
    return sweep_rows(rows, buckets)


def run_decision(spec: Any, plan: DecisionPlan) -> list[ResultRow]:
    """Measure ``plan`` on the Ray cluster this process is connected to; its rows (role ``decide``) as the
    sweep's (:func:`sweep_rows`). Every config's engine is checked against the key it was measured under
    before: a config the space builds differently is not measured (its rows would not pool with the first
    ones). Each config gets ``plan.starts`` trials of ``plan.rounds_per_start`` rounds, each trial its own
    engine start, queued in alternation (every config's first start, then every config's second, ...); the
    point's ``start`` (1..K) tells the trials apart in Tune's names and is no engine parameter."""
    import ray
    from ray import tune

    from tuning.sweep.actors import GpuLease
    from tuning.sweep.records import TrialReport
    from tuning.sweep.trial import TrialContext, run_trial

    run_dir = Path(spec.run_dir) / DECIDE_DIR
    run_dir.mkdir(parents=True, exist_ok=True)
    budget = Path(spec.run_dir) / BUDGET_FILE  # the sweep's deadline holds for these engine starts too
    if budget.exists():
        shutil.copyfile(budget, run_dir / BUDGET_FILE)
    points = []
    own = list(spec.space.extra_flags)
    for key, params in plan.points.items():
        flags = list(params.get("extra_flags") or ())
        point = {"role": ROLE_DECIDE, **params, "extra_flags": flags[len(own):] if flags[:len(own)] == own else flags}
        built = spec.space.config_from_trial_config(point).key()
        if built == key:
            points.append(point)
        else:
            logger.warning("decide: %s is built as %s from its params; not measured again", key, built)
    if not points:
        return []
    # A1, B1, A2, B2, ...: Tune queues grid entries in order. No cache actor below (a ResultCache would hand
    # a repeated engine key the first start's rows): every entry is a trial with an engine start of its own.
    points = [{**point, "start": i + 1} for i in range(plan.starts) for point in points]
    namespace = ray.get_runtime_context().namespace
    lease_name = f"{spec.measure_lease_name()}-decide-{uuid.uuid4().hex[:6]}" if spec.share_gpu else None
    lease = (ray.remote(GpuLease).options(name=lease_name, namespace=namespace, num_cpus=0).remote()
             if lease_name else None)
    context = TrialContext(sweep_id=spec.sweep_id, run_dir=str(run_dir), space=spec.space, buckets=plan.buckets,
                           plan=dataclasses.replace(spec.measure_plan(), repeats=plan.rounds_per_start),
                           cache_namespace=namespace, measure_lease_actor=lease_name)

    def trial(config: dict[str, Any], context: TrialContext) -> None:
        run_trial(config["point"], context)

    def resources(config: dict[str, Any]) -> Any:
        return spec.resources_for(config["point"])

    trainable = tune.with_resources(tune.with_parameters(trial, context=context),
                                    resources if spec.share_gpu else dict(spec.trial_resources))
    try:
        grid = tune.Tuner(
            trainable, param_space={"point": tune.grid_search(points)},
            tune_config=tune.TuneConfig(max_concurrent_trials=spec.max_concurrent_trials, reuse_actors=True),
            run_config=tune.RunConfig(name=f"tune-{uuid.uuid4().hex[:6]}", storage_path=str(run_dir.resolve()),
                                      verbose=0, failure_config=tune.FailureConfig(max_failures=0)),
        ).fit()
    finally:
        if lease is not None:
            ray.kill(lease)
    rows: list[ResultRow] = []
    for res in grid:
        trial_id = (res.metrics or {}).get("trial_id")
        report = TrialReport.load(str(run_dir), trial_id) if trial_id else None
        if report is not None:
            rows.extend(report.rows)
    return sweep_rows(rows, spec.buckets)
