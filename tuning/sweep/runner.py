"""Running a sweep: the Tune experiment (new or resumed), its results frame, and the committed table.

- Each Tune trial (:func:`tuning.sweep.trial.run_trial`) reserves its GPUs (``{"gpu": tp}``; the
  simulator needs one CPU and no GPU), starts one engine, measures every bucket, stops it; the
  searcher (:mod:`tuning.sweep.searcher`) decides what runs next.
- ``--share-gpu`` (tp=1, small models): a trial reserves its memory fraction + headroom of one GPU
  (:meth:`EngineConfig.gpu_request`), so engines whose fractions fit start side by side on a GPU
  (start-up is what a trial pays for), while the per-GPU lease (:class:`tuning.sweep.actors.GpuLease`)
  lets only one of them be measured at a time: no figure is taken while another engine on the same
  GPU serves load *or starts up* (CUDA graph capture and warm-up are GPU work).
- Budgets live in ``<run_dir>/budget.json`` (:mod:`tuning.sweep.budget`), so ``--resume`` can extend
  them: the sweep continues from Tune's experiment state and the same Optuna study; finished trials
  are neither lost nor re-run. The time budget is *soft*: no trial starts its engine after it, running
  trials finish (an engine start is too expensive to throw away half-measured).
- Results (one row per trial x bucket x concurrency) come from the trials' saved reports and go to
  ``results.parquet``/``.csv``; :mod:`tuning.choose` decides the routing table from them (fitted
  to ``--serve-gpus`` when given) and the runner commits it. An incomplete sweep writes no table and
  keeps the previous one.
"""
from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.table import RoutingTable, RoutingTableError
from tuning.choose.commit import commit_table, table_targets
from tuning.choose.table import choose_table
from tuning.results import failed_rows, results_frame, write_results
from tuning.schedule import schedule_table
from tuning.sweep.actors import GpuLease, ResultCache
from tuning.sweep.budget import TimeBudgetSpent, write_budget
from tuning.sweep.progress import SweepProgress, make_callback
from tuning.sweep.provenance import provenance_for
from tuning.sweep.records import ResultRow, TrialReport, reported_trial_ids
from tuning.sweep.space import ROLE_SEARCH
from tuning.sweep.spec import SweepError, SweepSpec
from tuning.sweep.trial import run_trial

__all__ = ["EXPERIMENT_NAME", "REPORTED_NOTHING", "TRIAL_ERRORED", "SweepOutcome", "rows_from_result_grid",
           "run_sweep"]

logger = logging.getLogger(__name__)

EXPERIMENT_NAME = "tune"


@dataclass(frozen=True)
class SweepOutcome:
    """What a sweep left behind."""

    spec: SweepSpec
    results: Any  # pandas.DataFrame
    table: RoutingTable | None
    table_path: Path | None
    error: str | None
    results_paths: tuple[Path, ...]
    wall_s: float


#: Failure reasons of rows the driver writes for a trial without a report of its own.
TRIAL_ERRORED = "trial errored"
REPORTED_NOTHING = "trial reported nothing (stopped or interrupted)"


def _trial_dirname(trial: Any) -> str:
    return f"trial_{trial.trial_id}"


def rows_from_result_grid(grid: Any, spec: SweepSpec) -> list[ResultRow]:
    """Every trial's rows: the report the trial saved in the run dir, else failed rows saying why it has
    none (Tune's error, or that it reported nothing). Reports of trials Tune's restored state does not
    know at all (created after its last experiment checkpoint) are kept too."""
    rows: list[ResultRow] = []
    seen: set[str] = set()
    for res in grid:
        metrics = res.metrics or {}
        trial_id = metrics.get("trial_id") or Path(str(res.path)).name.removeprefix("trial_")
        seen.add(trial_id)
        report = TrialReport.load(spec.run_dir, trial_id)
        if report is not None:
            rows.extend(report.rows)
            continue
        # A trial that reported nothing has no config in its Result: Tune's params.json has it.
        cfg = res.config or _trial_params(res.path)
        try:
            config = spec.space.config_from_trial_config(cfg) if cfg else None
        except ConfigError:
            config = None
        reason = _error_reason(res.error) if res.error else REPORTED_NOTHING
        rows.extend(ResultRow.from_mapping(r) for r in failed_rows(
            sweep_id=spec.sweep_id, trial_id=trial_id, role=str(cfg.get("role") or ROLE_SEARCH), config=config,
            buckets=spec.buckets, reason=reason[:1500]))
    for trial_id in reported_trial_ids(spec.run_dir):
        if trial_id not in seen and (report := TrialReport.load(spec.run_dir, trial_id)) is not None:
            rows.extend(report.rows)
    return rows


def _error_reason(error: BaseException) -> str:
    """A failure reason for a trial Tune marked errored: a trial the time budget kept from starting
    says just that (its message tells how to run it); anything else keeps Ray's whole report."""
    # Ray's wrapper keeps the trial's own exception in ``cause``, also in a result read back from
    # Tune's saved experiment.
    cause = getattr(error, "cause", None)
    return f"{TRIAL_ERRORED}: {cause if isinstance(cause, TimeBudgetSpent) else error}"


def _trial_params(trial_path: Any) -> dict[str, Any]:
    try:
        return json.loads((Path(str(trial_path)) / "params.json").read_text())
    except (OSError, ValueError):
        return {}


def _cache_seed(rows: Sequence[ResultRow]) -> dict[str, list[ResultRow]]:
    """Rows of measured (not cached) trials by engine key, to seed a resumed sweep's cache. Rows the
    driver wrote for a trial that errored or was interrupted are not measurements: seeding them would
    hand the resumed trial its own interruption as a cached result instead of running it."""
    by_key: dict[str, list[ResultRow]] = {}
    for r in rows:
        if r.engine_key and not r.cached and not str(r.failure_reason).startswith((TRIAL_ERRORED, REPORTED_NOTHING)):
            by_key.setdefault(r.engine_key, []).append(r)
    return by_key


def run_sweep(
    spec: SweepSpec,
    *,
    num_trials: int | None,
    time_budget_s: float | None = None,
    resume: bool = False,
    live: bool = True,
    commit_to: Sequence[str | Path] = (),
    traffic: Any = None,
    stop_after_s: float | None = None,
) -> SweepOutcome:
    """Run (or resume) a sweep on the Ray cluster this process is connected to; write results and the
    routing table (its replicas planned for ``traffic``, a :class:`tuning.traffic.TrafficMix`, when the
    spec has a GPU budget). Returns the outcome; an incomplete result is reported in ``outcome.error`` (the
    previous routing table is untouched), never raised."""
    import ray
    from ray import tune

    from tuning.sweep.searcher import build_search_alg

    if not ray.is_initialized():
        raise SweepError("Ray is not initialised; call ray.init() (the CLI does this) before run_sweep")
    if stop_after_s is not None and (stop_after_s <= 0 or (time_budget_s and stop_after_s < time_budget_s)):
        raise SweepError(f"stop_after_s={stop_after_s:g} must be > 0 and at least the time budget "
                         f"({time_budget_s:g} s): it stops the rounds of engines the budget let start"
                         if time_budget_s else f"stop_after_s={stop_after_s:g} must be > 0")
    t0 = time.monotonic()
    run_dir = Path(spec.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    exp_path = run_dir / EXPERIMENT_NAME
    (run_dir / "sweep.json").write_text(json.dumps(spec.to_dict(), indent=2))
    write_budget(run_dir, num_trials=num_trials, time_budget_s=time_budget_s, stop_after_s=stop_after_s)

    namespace = ray.get_runtime_context().namespace
    cache_name = f"mtp-sweep-cache-{spec.sweep_id}-{uuid.uuid4().hex[:6]}"
    if resume and not tune.Tuner.can_restore(str(exp_path)):
        raise SweepError(f"nothing to resume in {run_dir}: no Tune experiment state under {exp_path}; "
                         "start a new sweep without --resume")
    if not resume and exp_path.exists():
        raise SweepError(f"{run_dir} already holds a sweep; pass --resume {run_dir} to continue it, "
                         "or choose a new --run-dir")
    cache = ray.remote(ResultCache).options(name=cache_name, namespace=namespace, num_cpus=0).remote()
    lease = (ray.remote(GpuLease).options(name=spec.measure_lease_name(), namespace=namespace, num_cpus=0,
                                           get_if_exists=True).remote()
             if spec.share_gpu else None)
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, context=spec.trial_context(cache_name, namespace)),
        spec.resources_for if spec.share_gpu else dict(spec.trial_resources),
    )
    progress = SweepProgress([b.name for b in spec.buckets], simulated=spec.simulated, live=live)
    try:
        grid = None
        reported = len(reported_trial_ids(run_dir))
        if resume and num_trials is not None and reported >= num_trials:
            # The reported trials meet the budget: the sweep ends with what was measured. The trials
            # the interruption cut short are not restarted (each would pay an engine start); they
            # are listed as interrupted. Read from the saved experiment, not restored into a Tuner
            # (that would also restore the searcher, whose study lives where the run dir was made).
            logger.info("%d trials reported, budget %d: nothing left to run", reported, num_trials)
            grid = tune.ResultGrid(tune.ExperimentAnalysis(str(exp_path)))
        elif resume:
            try:
                tuner = tune.Tuner.restore(str(exp_path), trainable=trainable, resume_unfinished=True,
                                           resume_errored=True)
            except Exception as e:  # noqa: BLE001 - Tune/Optuna/SQLAlchemy errors alike
                raise SweepError(
                    f"cannot restore the sweep in {run_dir} ({type(e).__name__}: {str(e)[:300]}). A run dir "
                    f"moved from where it was made can still commit its table from the {reported} reported "
                    f"trials (--resume {run_dir} --num-trials {reported}), not run more") from e
            # Seed the dedupe cache with what was measured before, so no config is started twice.
            for key, seeded in _cache_seed(rows_from_result_grid(tuner.get_results(), spec)).items():
                ray.get(cache.put.remote(key, seeded))
        else:
            tuner = tune.Tuner(
                trainable,
                tune_config=tune.TuneConfig(search_alg=build_search_alg(spec), num_samples=-1,
                                            reuse_actors=True,
                                            trial_dirname_creator=_trial_dirname),
                run_config=tune.RunConfig(
                    name=EXPERIMENT_NAME, storage_path=str(run_dir.resolve()), verbose=0,
                    failure_config=tune.FailureConfig(max_failures=0),
                    callbacks=[make_callback(progress)],
                ),
            )
        if grid is None:
            grid = tuner.fit()
    finally:
        progress.stop()
        ray.kill(cache)
        if lease is not None:
            ray.kill(lease)

    rows = rows_from_result_grid(grid, spec)
    if resume:  # measurements of an earlier decide phase (RUN_DIR/decide) stay in the results
        from tuning.sweep.decide import earlier_rows

        rows += earlier_rows(run_dir, spec.buckets)
    df = results_frame(rows)
    paths = write_results(df, run_dir)  # before any decide phase: the measurements are kept whatever it does
    decided = None
    if spec.decide_rounds:
        from tuning.sweep.decide import decide_phase

        rows, df, decided = decide_phase(spec, rows, df)
        paths = write_results(df, run_dir)
    table = table_path = None
    error = None
    try:
        table = schedule_table(choose_table(df, spec, provenance_for(spec, df), traffic), df)
        if decided:
            table = table.model_copy(update={"provenance": table.provenance.model_copy(
                update={"notes": (*table.provenance.notes, decided)})})
        targets = table_targets(spec, commit_to)
        table_path = targets[0]
        table = commit_table(table, targets)
    except RoutingTableError as e:
        error = str(e)
    return SweepOutcome(spec=spec, results=df, table=table, table_path=table_path, error=error,
                        results_paths=paths, wall_s=time.monotonic() - t0)
