"""The Tune trainable: one trial = one config measured on every bucket (:mod:`tuning.sweep.measure`),
with the Ray glue around it — the result cache, the GPU lease, the time-budget check, the report.

A failure of the engine (crash, OOM, hang) or an invalid config is a *result*: the trial reports
``status="failed"`` with the reason and a zero throughput per bucket, so the searcher learns the
config is bad and the sweep goes on; nothing is raised to Tune (which would retry or mark it
errored). The one exception is :class:`~tuning.sweep.budget.TimeBudgetSpent`: a trial that got its
resources after the time budget ran out ends errored, without a result, so ``--resume`` runs it.

Configs that render the same engine command (same :meth:`EngineConfig.key`) are measured once per
sweep: :class:`~tuning.sweep.actors.ResultCache` hands a second trial the first one's rows, marked
``cached``; a trial whose twin is still running waits for it.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config import EngineConfig
from orchestrator.errors import ConfigError, OrchestratorError
from tuning.buckets import Bucket
from tuning.results import STATUS_FAILED, STATUS_OK, failed_rows, rows_for_trial
from tuning.sweep.actors import cached_copy, measure_lease, startup_lease
from tuning.sweep.budget import BUDGET_FILE, TimeBudgetSpent, check_time_budget, read_budget, stop_reached
from tuning.sweep.measure import MeasurePlan, failure_reason, measure_config
from tuning.sweep.records import ResultRow, TrialReport
from tuning.sweep.space import ROLE_SEARCH, SearchSpace

__all__ = ["TrialContext", "run_trial"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrialContext:
    """Everything a trial needs besides its point; the same for every trial of a sweep.

    Args:
        sweep_id: id written into every row.
        run_dir: the sweep's folder (engine logs go to ``<run_dir>/engine-logs``, reports to
            ``<run_dir>/trial-results``).
        space: turns the trial's point into an :class:`EngineConfig`.
        buckets: what to measure.
        plan: how to measure it.
        cache_actor: name of the :class:`~tuning.sweep.actors.ResultCache` actor (``None``: no dedupe).
        cache_namespace: the Ray namespace of the sweep's actors.
        measure_lease_actor: name of the sweep's :class:`~tuning.sweep.actors.GpuLease` actor when
            engines share GPUs (start-ups side by side, each measurement alone); ``None``: each trial
            owns its GPUs, starts its engine at once and measures whenever it is ready.
    """

    sweep_id: str
    run_dir: str
    space: SearchSpace
    buckets: tuple[Bucket, ...]
    plan: MeasurePlan = field(default_factory=MeasurePlan)
    cache_actor: str | None = None
    cache_namespace: str | None = None
    measure_lease_actor: str | None = None


def run_trial(trial_config: dict[str, Any], context: TrialContext) -> None:
    """Tune function trainable (wrap with ``tune.with_parameters(run_trial, context=...)``)."""
    from ray import tune

    trial_id = tune.get_context().get_trial_id() or "local"
    earlier = TrialReport.load(context.run_dir, trial_id)
    if earlier is not None:
        # A resumed sweep restarts a trial whose report reached the run dir (and the Optuna study)
        # before the driver died but not Tune's experiment state: report it again, measure nothing.
        tune.report(earlier.metrics())
        return
    report = _trial_report(trial_config, context, trial_id)
    report.save(context.run_dir, trial_id)
    tune.report(report.metrics())


def _trial_report(trial_config: dict[str, Any], context: TrialContext, trial_id: str) -> TrialReport:
    import ray

    role = str(trial_config.get("role") or ROLE_SEARCH)
    buckets = context.buckets

    def outcome(rows: list[ResultRow], *, status: str, failure: str, config: EngineConfig | None,
                cached: bool = False, engine_started: bool = False) -> TrialReport:
        return TrialReport.build(rows, buckets, status=status, failure=failure, role=role,
                                 engine_key=config.key() if config else None,
                                 engine_label=config.label() if config else None,
                                 cached=cached, engine_started=engine_started)

    try:
        config = context.space.config_from_trial_config(trial_config)
    except ConfigError as e:
        rows = _typed(failed_rows(sweep_id=context.sweep_id, trial_id=trial_id, role=role, config=None,
                                  buckets=buckets, reason=f"invalid config: {e}"))
        return outcome(rows, status=STATUS_FAILED, failure=str(e), config=None)

    key = config.key()
    cache = None
    if context.cache_actor:
        try:
            cache = ray.get_actor(context.cache_actor, namespace=context.cache_namespace)
        except ValueError:
            logger.warning("result cache actor %s not found; measuring without dedupe", context.cache_actor)
    if cache is not None:
        while True:
            verdict, cached_rows = ray.get(cache.claim.remote(key, trial_id))
            if verdict == "cached":
                rows = cached_copy(cached_rows or [], trial_id=trial_id, role=role)
                failure = next((r.failure_reason for r in rows if r.failure_reason), "")
                status = STATUS_OK if any(r.status == STATUS_OK for r in rows) else STATUS_FAILED
                return outcome(rows, status=status, failure=failure, config=config, cached=True)
            if verdict == "run":
                break
            time.sleep(0.5)

    rows: list[ResultRow] | None = None
    try:
        rows, failure = _measure(config, context, trial_id, role)
    except TimeBudgetSpent:
        raise
    except (OrchestratorError, OSError) as e:
        failure = failure_reason("trial failed", e)
        rows = _typed(failed_rows(sweep_id=context.sweep_id, trial_id=trial_id, role=role, config=config,
                                  buckets=buckets, reason=failure))
    finally:
        if cache is not None:
            if rows is not None:
                ray.get(cache.put.remote(key, rows))
            else:
                ray.get(cache.release.remote(key))
    any_ok = any(r.status == STATUS_OK for r in rows)
    status = STATUS_OK if any_ok and not failure else STATUS_FAILED
    if not failure and not any_ok:
        failure = next((r.failure_reason for r in rows if r.failure_reason), None) or "no bucket succeeded"
    return outcome(rows, status=status, failure=failure, config=config, engine_started=True)


def _measure(config: EngineConfig, context: TrialContext, trial_id: str, role: str) -> tuple[list[ResultRow], str]:
    """Measure ``config`` on this trial's GPUs (under the sweep's lease when engines share them)."""
    import ray

    from orchestrator.hostinfo import measured_on

    gpus = [int(g) for g in ray.get_gpu_ids()] if not config.simulated else None
    startup_guard = measure_guard = None
    if context.measure_lease_actor and gpus:
        lease = ray.get_actor(context.measure_lease_actor, namespace=context.cache_namespace)
        node = ray.get_runtime_context().get_node_id()
        gpu_keys = [f"{node}:{g}" for g in gpus]
        startup_guard = functools.partial(startup_lease, lease, gpu_keys, trial_id)
        measure_guard = functools.partial(measure_lease, lease, gpu_keys, trial_id)
    measurements, failure, startup_s = measure_config(
        config, context.buckets, context.plan, log_dir=Path(context.run_dir) / "engine-logs" / trial_id, gpus=gpus,
        startup_guard=_within_time_budget(context.run_dir, startup_guard), measure_guard=measure_guard,
        should_stop=lambda: stop_reached(read_budget(Path(context.run_dir) / BUDGET_FILE)))
    rows = rows_for_trial(sweep_id=context.sweep_id, trial_id=trial_id, role=role, config=config,
                          buckets=context.buckets, measurements=measurements, failure=failure,
                          engine_startup_s=startup_s)
    facts = measured_on(config.engine_name) if gpus else {}
    return [ResultRow.from_mapping({**r, **facts}) for r in rows], failure


def _typed(rows: list[dict[str, Any]]) -> list[ResultRow]:
    return [ResultRow.from_mapping(r) for r in rows]


def _within_time_budget(run_dir: str, guard: Callable[[], contextlib.AbstractContextManager[Any]] | None
                        ) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """``guard`` (if any), then the sweep's time-budget check, right before the engine starts.

    Tune suggests trials ahead of the resources they wait for (a 0.9-GPU baseline can wait minutes for
    its share), and a shared GPU's start-up lease can hold a trial back too: whether the budget allows a
    start is decided when the engine is about to start. Past it, :class:`TimeBudgetSpent` ends the trial
    as errored, without a result, so a resumed sweep runs it."""

    @contextlib.contextmanager
    def entered() -> Iterator[None]:
        with guard() if guard is not None else contextlib.nullcontext():
            check_time_budget(run_dir)
            yield

    return entered
