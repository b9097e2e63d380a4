"""``python -m tuning.sweep``: search engine configs per output-length bucket with Ray Tune + Optuna,
measure the baselines under the same workloads, and commit a routing table.

Without arguments it sweeps the simulated engine (calibrated profile ``intern-s2-preview-8xh200``)
on a local Ray and finishes in a few minutes on a laptop; every figure is labelled SIMULATED.
``--model PATH`` sweeps LMDeploy on the GPUs of the Ray cluster (``--address`` to join one).

How the pieces fit:

- :class:`~tuning.space.SearchSpace` is the define-by-run space given to ``OptunaSearch`` (TPE,
  seeded, study in ``<run_dir>/optuna.db`` so ``optuna-dashboard sqlite:///<run_dir>/optuna.db``
  opens it). The baselines (MTP off; the published static recommendation) are enqueued into that
  study first, tagged by ``user_attrs``, so they run under the same workloads as every other trial;
  their values outside the searched space are fixed constants, not new choices for TPE.
- Each Tune trial (:func:`tuning.trial.run_trial`) reserves its GPUs (``{"gpu": tp}``; the
  simulator needs one CPU and no GPU), starts one engine, measures every bucket, stops it.
  ``--share-gpu`` (tp=1, small models): a trial reserves its memory fraction + headroom of one GPU
  (:meth:`EngineConfig.gpu_request`), so engines whose fractions fit start side by side on a GPU
  (start-up is what a trial pays for), while a per-GPU readers-writer lease
  (:class:`tuning.trial.GpuLease`) lets only one of them be measured at a time: no figure is taken
  while another engine on the same GPU serves load *or starts up* (CUDA graph capture and warm-up
  are GPU work; in an H200 sweep they overlapped half the measurements). A waiting measurement holds off new start-ups, so they cannot starve it.
- ``--serve-gpus N``: the committed table must be servable on N GPUs (one replica per engine, each
  reserving what :meth:`EngineConfig.gpu_request` says under ``--share-gpu``): per-bucket bests that
  each fit the GPU alone may not fit together. :func:`tuning.results.pick_best` then takes the
  fitting mix of the buckets' top configs with the best scalar objective, and says in the table's
  ``provenance.gpu_budget`` what it gave up. Without it the summary still says what the table needs.
- Budgets (``--num-trials``, ``--time-budget-s``) live in ``<run_dir>/budget.json``
  (:mod:`tuning.budget`) and are read by the searcher at every suggestion, so ``--resume`` can
  extend them: the sweep continues from Tune's experiment state and the same Optuna study; finished
  trials are neither lost nor re-run. The time budget is *soft*: no trial starts its engine after it,
  running trials finish (an engine start is too expensive to throw away half-measured). Tune creates
  trials before their resources are free, so each trial checks the budget again right before its
  engine starts; one that got its resources too late ends errored without a result, and ``--resume``
  runs it.
- Results (one row per trial x bucket x concurrency) go to ``results.parquet``/``.csv``;
  :func:`tuning.results.pick_best` chooses per bucket; :func:`orchestrator.table.commit` writes the
  table atomically. An incomplete sweep writes no table and keeps the previous one.

Objective (``--objective``). The default is ``scalar``: the mean over buckets of
``log(output throughput)``, which ranks trials exactly like the mean of ``log(throughput / MTP-off
baseline)`` (the baseline is a per-bucket constant), so it needs no baseline at trial time. The
routing table takes each bucket's best from *all* measured trials whichever objective guided the
search; the objective only decides where TPE looks next. ``benchmarks/optuna_vs_grid.py`` compares
both on the simulator (147-config default space, 10 seeds): to get every bucket within 3% of the
grid's best both need at most 10 distinct configs (7% of the grid); within 0.5%, scalar needs at
most 14 and multi-objective TPE 16 — MOTPE spreads its trials along a Pareto front of four highly
correlated objectives, while the scalar concentrates TPE on the draft axis that separates the
buckets. So ``scalar`` is the default; ``multi`` is available.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import logging
import math
import os
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from orchestrator.config import EngineConfig
from orchestrator.errors import ConfigError, OrchestratorError
from orchestrator import table as routing
from orchestrator.fsutil import utc_now_iso
from tuning.budget import BUDGET_FILE, TimeBudgetSpent, read_budget, time_budget_spent, write_budget
from tuning.buckets import MIN_MEASURED_WAVES, Bucket, make_buckets
from tuning.results import (
    STATUS_OK,
    Constraints,
    failed_rows,
    pick_best,
    results_frame,
    summary_rows,
    write_results,
)
from orchestrator.table import GpuBudget, Provenance, RoutingTable, RoutingTableError
from tuning.space import ROLE_SEARCH, SearchSpace, load_space_file
from tuning.trial import (
    GpuLease,
    ResultCache,
    TrialContext,
    detect_gpus,
    metric_name,
    reported_metrics,
    reported_trial_ids,
    run_trial,
)

__all__ = ["SweepSpec", "SweepOutcome", "SweepError", "run_sweep", "build_spec", "main", "load_defaults"]

logger = logging.getLogger(__name__)

DEFAULTS_PATH = Path(__file__).with_name("defaults.yaml")
SIM_PROFILE = "intern-s2-preview-8xh200"
EXPERIMENT_NAME = "tune"


class SweepError(OrchestratorError):
    """The sweep could not run (bad arguments, nothing to resume, Ray unavailable)."""


def load_defaults(path: str | Path = DEFAULTS_PATH) -> dict[str, Any]:
    try:
        return yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise SweepError(f"cannot read sweep defaults {path}: {e}") from None


GPU_WARMUP_REQUESTS = 64
"""Warm-up requests per bucket on real engines (one batch at the default concurrency; output capped
by the bench client): measured on the H200, a fresh engine's first batch ran at ~2 s median TTFT vs
~0.7 s once warm (benchmarks/results/gpu_e2e_h200_2026-11-29)."""


# ----- the sweep's fixed description ------------------------------------------------------------------
@dataclass(frozen=True)
class SweepSpec:
    """Everything that defines a sweep; saved as ``<run_dir>/sweep.json`` so ``--resume`` rebuilds it.

    Budgets are not here (``budget.json``): a resumed sweep may get a larger one.
    """

    sweep_id: str
    run_dir: str
    space: SearchSpace
    buckets: tuple[Bucket, ...]
    objective: str = "scalar"
    seed: int = 0
    max_concurrent_trials: int = 1
    trial_resources: Mapping[str, float] = field(default_factory=lambda: {"cpu": 1, "gpu": 0})
    sim_time_scale: float | None = None
    steady_state: Mapping[str, Any] | None = field(default_factory=lambda: {"rel_tolerance": 0.02})
    steady_state_min_output_len: int = 4096
    constraints: Constraints = Constraints()
    routing_table: str | None = None
    ready_timeout_s: float = 900.0
    request_timeout_s: float = 3600.0
    tokenizer: str | None = None
    n_startup_trials: int = 8
    share_gpu: bool = False
    serve_gpus: int | None = None
    """GPUs the committed table must be servable on (one replica per engine, sharing per
    ``share_gpu``); ``None``: no limit. Decides only the choice, never what is measured."""
    repeats: int = 1
    """Runs of each bucket on the same engine; the lower-median run is kept, all runs are recorded."""
    burn_in: bool = False
    """Run the first bucket's workload once, unmeasured, before measuring (real engines: the first
    full-load run after start-up was the slower one on 7 of 7 H200 engines, by up to 1.66x)."""

    def __post_init__(self) -> None:
        if self.share_gpu and self.space.tp != 1:
            raise ConfigError(f"share_gpu needs tp=1 engines (got tp={self.space.tp}): a tp>1 engine owns its GPUs")
        if self.serve_gpus is not None and (not isinstance(self.serve_gpus, int) or self.serve_gpus < 1):
            raise ConfigError(f"serve_gpus={self.serve_gpus!r} must be a whole number of GPUs >= 1")
        if self.serve_gpus is not None and not self.simulated and self.serve_gpus < self.space.tp:
            # Found out only after the whole sweep otherwise.
            raise ConfigError(f"serve_gpus={self.serve_gpus} cannot hold even one engine of tp={self.space.tp}")
        if not isinstance(self.repeats, int) or self.repeats < 1:
            raise ConfigError(f"repeats={self.repeats!r} must be a whole number >= 1")
        if self.objective not in ("scalar", "multi"):
            raise ConfigError(f"objective={self.objective!r} is invalid; allowed: 'scalar', 'multi'")
        if self.max_concurrent_trials < 1:
            raise ConfigError(f"max_concurrent_trials={self.max_concurrent_trials} must be >= 1")
        if not self.buckets:
            raise ConfigError("a sweep needs at least one bucket")

    @property
    def simulated(self) -> bool:
        return self.space.engine == "sim"

    def metrics(self) -> list[str]:
        return [metric_name(b.name) for b in self.buckets]

    def to_dict(self) -> dict[str, Any]:
        return {
            "sweep_id": self.sweep_id, "run_dir": self.run_dir, "space": self.space.describe(),
            "buckets": [b.to_dict() for b in self.buckets], "objective": self.objective, "seed": self.seed,
            "max_concurrent_trials": self.max_concurrent_trials, "trial_resources": dict(self.trial_resources),
            "sim_time_scale": self.sim_time_scale,
            "steady_state": dict(self.steady_state) if self.steady_state else None,
            "steady_state_min_output_len": self.steady_state_min_output_len,
            "constraints": self.constraints.to_dict(), "routing_table": self.routing_table,
            "ready_timeout_s": self.ready_timeout_s, "request_timeout_s": self.request_timeout_s,
            "tokenizer": self.tokenizer, "n_startup_trials": self.n_startup_trials,
            "share_gpu": self.share_gpu, "serve_gpus": self.serve_gpus, "repeats": self.repeats,
            "burn_in": self.burn_in,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SweepSpec:
        d = dict(d)
        d["space"] = SearchSpace.from_mapping({k: v for k, v in d["space"].items() if k != "points"}).replace(
            points=tuple(d["space"].get("points", [])))
        d["buckets"] = tuple(Bucket.from_dict(b) for b in d["buckets"])
        d["constraints"] = Constraints(**d.get("constraints", {}))
        return cls(**d)

    def trial_context(self, cache_actor: str | None, cache_namespace: str | None) -> TrialContext:
        return TrialContext(
            sweep_id=self.sweep_id, run_dir=self.run_dir, space=self.space, buckets=self.buckets,
            sim_time_scale=self.sim_time_scale, steady_state=self.steady_state,
            steady_state_min_output_len=self.steady_state_min_output_len, cache_actor=cache_actor,
            cache_namespace=cache_namespace, ready_timeout_s=self.ready_timeout_s,
            request_timeout_s=self.request_timeout_s, tokenizer=self.tokenizer,
            measure_lease_actor=self.measure_lease_name() if self.share_gpu else None,
            repeats=self.repeats, burn_in=self.burn_in,
        )

    def gpu_budget(self) -> GpuBudget | None:
        """What :func:`~tuning.results.pick_best` must fit the table into (``None``: no limit)."""
        return None if self.serve_gpus is None else GpuBudget(gpus=self.serve_gpus, share_gpu=self.share_gpu)

    def measure_lease_name(self) -> str:
        return f"mtp-sweep-measure-lease-{self.sweep_id}"

    def resources_for(self, trial_config: Mapping[str, Any]) -> Any:
        """Tune's per-trial resource request: a fixed bundle, or with ``share_gpu`` the share of a
        GPU the trial's engine config asks for (:meth:`EngineConfig.gpu_request`)."""
        # The conversion Tune applies to a plain resource dict, so both paths request alike.
        from ray.tune.execution.placement_groups import resource_dict_to_pg_factory

        resources = dict(self.trial_resources)
        if self.share_gpu and not self.simulated:
            try:
                resources["gpu"] = self.space.config_from_trial_config(trial_config).gpu_request(share_gpu=True)
            except ConfigError:
                pass  # the trial reports the invalid config itself; it keeps the fixed request
        return resource_dict_to_pg_factory(resources)


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


def _make_searchers() -> tuple[type, type]:
    """Searcher classes are built lazily so that importing this module does not import Ray Tune."""
    from ray.tune.search import SearchGenerator, Searcher

    class BudgetedSearch(Searcher):
        """Wraps ``OptunaSearch`` with budgets and dedupe.

        Budgets: stops suggesting once the trial or time budget (re-read from ``budget.json`` every
        time) is spent. Trials are counted in the Optuna study itself (trials asked of it, minus the
        duplicates below), so the count survives restarts.

        Dedupe: a suggestion whose engine command was already measured in this sweep is told to
        Optuna at once with the measured result (tagged ``duplicate_of``) and TPE is asked again, so
        a Tune trial — and the budget — goes to a config not yet measured. After
        ``max_dedupe_attempts`` the duplicate is run anyway; the trial then reports the cached
        result (see :class:`tuning.trial.ResultCache`).

        ``named_first`` (shared GPUs): while a named point (a baseline) is suggested and not complete,
        nothing else is suggested. Ray grants GPU shares to whichever request fits, so a baseline's
        0.9-GPU reservation waits behind every small search trial that keeps fitting (GPU run 4: the
        static baseline waited 9 minutes, then a call's deadline cut it) — and without both baselines
        no table is committed. A 0.9 share runs alone anyway, so running the baselines first, one
        after another, costs the one-GPU sweep nothing."""

        max_dedupe_attempts = 20

        def __init__(self, searcher: Any, budget_path: str, space: SearchSpace, *, named_first: bool = False) -> None:
            super().__init__(metric=searcher.metric, mode=searcher.mode)
            self.searcher = searcher
            self.budget_path = budget_path
            self.space = space
            self.named_first = named_first
            self.known: dict[str, dict[str, Any]] = {}
            self.running: dict[str, str] = {}  # trial id -> engine key, suggested and not complete
            self.named_open: set[str] = set()  # named points suggested and not complete
            self._named_open_checked = True  # False after a restore, until checked against the study

        def _asked(self) -> int:
            from optuna.trial import TrialState

            study = self.searcher._ot_study
            return sum(1 for t in study.get_trials(deepcopy=False)
                       if t.state != TrialState.WAITING and "duplicate_of" not in t.user_attrs)

        def _key(self, config: Mapping[str, Any]) -> str | None:
            try:
                return self.space.config_from_trial_config(config).key()
            except ConfigError:
                return None

        def suggest(self, trial_id: str) -> dict | None:
            budget = read_budget(self.budget_path)
            n = budget.get("num_trials")
            if time_budget_spent(budget):
                return Searcher.FINISHED
            if trial_id in self.searcher._ot_trials:
                return self.searcher.suggest(trial_id)
            if n is not None and self._asked() >= n:
                return Searcher.FINISHED
            if self.named_first and self.named_open and not self._named_open_checked:
                self._drop_finished_named()
            if self.named_first and self.named_open:
                return None  # not now: Tune asks again
            inner = self.searcher
            for attempt in range(self.max_dedupe_attempts):
                tmp = f"{trial_id}~{attempt}"
                config = inner.suggest(tmp)
                key = self._key(config)
                known = self.known.get(key) if key else None
                running = key is not None and key in self.running.values()
                if (known is None and not running) or attempt == self.max_dedupe_attempts - 1:
                    inner._ot_trials[trial_id] = inner._ot_trials.pop(tmp)
                    if key:
                        self.running[trial_id] = key
                    if config.get("role", ROLE_SEARCH) != ROLE_SEARCH:
                        self.named_open.add(trial_id)
                    return config
                inner._ot_trials[tmp].set_user_attr("duplicate_of", key)
                # Measured: tell TPE the measured value. Being measured: pruned (TPE ignores it).
                inner.on_trial_complete(tmp, result=known)
            return None  # unreachable

        def on_trial_result(self, trial_id: str, result: dict) -> None:
            self._tell_inner(self.searcher.on_trial_result, trial_id, result)

        def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
            self.running.pop(trial_id, None)
            self.named_open.discard(trial_id)
            if result and result.get("engine_key") and not error:
                keep = {k: v for k, v in result.items() if k == "score" or k.startswith("tput_")}
                self.known.setdefault(result["engine_key"], keep)
            self._tell_inner(self.searcher.on_trial_complete, trial_id, result=result, error=error)

        @staticmethod
        def _tell_inner(fn: Any, trial_id: str, *args: Any, **kwargs: Any) -> None:
            """The Optuna study commits a trial's result at once, Tune's experiment state only every
            few seconds: a driver killed in between leaves a trial that Tune restarts on resume
            while its Optuna trial is already finished. That trial re-reports its saved result
            (:func:`tuning.trial.reported_metrics`); the study has it already, so it is not told twice."""
            from optuna.exceptions import UpdateFinishedTrialError

            try:
                fn(trial_id, *args, **kwargs)
            except UpdateFinishedTrialError:
                logger.info("trial %s: its result was recorded before the restart; not told again", trial_id)

        def set_search_properties(self, metric: Any, mode: Any, config: dict, **spec: Any) -> bool:
            return self.searcher.set_search_properties(metric, mode, config, **spec)

        @property
        def metric(self) -> Any:
            return self.searcher.metric

        @property
        def mode(self) -> Any:
            return self.searcher.mode

        def get_state(self) -> dict:
            """Saved by Tune's search generator with the experiment (the wrapped Optuna searcher is
            saved on its own). The budget path is not state: it follows the run dir."""
            return {"known": dict(self.known), "running": dict(self.running), "named_open": sorted(self.named_open)}

        def set_state(self, state: dict) -> None:
            """A resumed sweep keeps deduplicating against what was measured, and keeps holding back
            search trials while a baseline that Tune restarts is open (else a restarted 0.9-GPU
            baseline waits behind small trials again). Tune restores this before the Optuna searcher,
            so the baselines that finished after the last save are dropped at the first suggestion."""
            self.known = dict(state.get("known", {}))
            self.running = dict(state.get("running", {}))
            self.named_open = set(state.get("named_open", ()))
            self._named_open_checked = False

        def _drop_finished_named(self) -> None:
            """Keep only the open baselines whose Optuna trial is still running: the study records a
            completion at once, Tune's saved state only every few seconds."""
            from optuna.trial import TrialState

            self._named_open_checked = True
            running = {t.number for t in self.searcher._ot_study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
            trials = self.searcher._ot_trials
            self.named_open = {tid for tid in self.named_open if tid in trials and trials[tid].number in running}

        def save(self, checkpoint_path: str) -> None:
            self.searcher.save(checkpoint_path)

        def restore(self, checkpoint_path: str) -> None:
            self.searcher.restore(checkpoint_path)

    class ResumableSearchGenerator(SearchGenerator):
        """Tune marks its search generator finished once the searcher says so and saves that flag; a
        resumed sweep with a larger budget must ask again, so the flag is not restored (the
        budgeted searcher says FINISHED again at once if the budget is still spent)."""

        def set_state(self, state: dict) -> None:
            super().set_state(state)
            self._finished = False

    return BudgetedSearch, ResumableSearchGenerator


def _trial_dirname(trial: Any) -> str:
    return f"trial_{trial.trial_id}"


def _study_name(spec: SweepSpec) -> str:
    return f"mtp-sweep-{spec.sweep_id}"


def _storage(spec: SweepSpec) -> Any:
    import optuna

    return optuna.storages.RDBStorage(f"sqlite:///{Path(spec.run_dir).resolve() / 'optuna.db'}")


def _directions(spec: SweepSpec) -> dict[str, Any]:
    if spec.objective == "multi":
        return {"directions": ["maximize"] * len(spec.buckets)}
    return {"direction": "maximize"}


def _enqueue_named_points(spec: SweepSpec, storage: Any) -> None:
    """Baselines (and test points) first, tagged by user_attrs the define-by-run space returns."""
    import optuna

    study = optuna.create_study(storage=storage, study_name=_study_name(spec), load_if_exists=True,
                                **_directions(spec))
    if study.get_trials(deepcopy=False):
        return  # resumed: already enqueued (and probably run)
    for p in spec.space.points:
        suggested, fixed = spec.space.split_point(p.params)
        study.enqueue_trial(suggested, user_attrs={"role": p.role, "extra_flags": list(p.extra_flags), "fixed": fixed},
                            skip_if_exists=False)


def _build_search_alg(spec: SweepSpec) -> Any:
    import warnings

    import optuna

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    storage = _storage(spec)
    _enqueue_named_points(spec, storage)
    sampler = optuna.samplers.TPESampler(seed=spec.seed, multivariate=True, group=True,
                                         constant_liar=spec.max_concurrent_trials > 1,
                                         n_startup_trials=spec.n_startup_trials)
    if spec.objective == "multi":
        metric: Any = spec.metrics()
        mode: Any = ["max"] * len(metric)
    else:
        metric, mode = "score", "max"
    optuna_search = OptunaSearch(space=spec.space, metric=metric, mode=mode, sampler=sampler,
                                 study_name=_study_name(spec), storage=storage)
    BudgetedSearch, ResumableSearchGenerator = _make_searchers()
    budgeted = BudgetedSearch(optuna_search, str(Path(spec.run_dir) / BUDGET_FILE), spec.space,
                              named_first=spec.share_gpu)
    limited = ConcurrencyLimiter(budgeted, max_concurrent=spec.max_concurrent_trials)
    return ResumableSearchGenerator(limited)


# ----- progress (a Tune callback; the rich display is one implementation, never fatal) ----------------
class SweepProgress:
    """Progress: trials done / running / failed and the best figure so far per bucket — a live
    table on a terminal, or (``live=False``: logs, CI, a device call's output) one line per trial
    started and finished, so a sweep cut short still shows how far it got and how fast."""

    def __init__(self, buckets: Sequence[str], *, simulated: bool, live: bool = True) -> None:
        self.buckets = list(buckets)
        self.simulated = simulated
        self.live = live
        self.running: set[str] = set()
        self.done = 0
        self.failed = 0
        self.cached = 0
        self.best: dict[str, tuple[float, str]] = {}
        self._display: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_display"] = None
        return state

    def start(self) -> None:
        if not self.live:
            return
        try:
            from rich.console import Console
            from rich.live import Live

            self._display = Live(self.render(), console=Console(stderr=True), refresh_per_second=2, transient=False)
            self._display.start()
        except Exception:  # noqa: BLE001 - display errors are never fatal
            logger.exception("progress display failed to start")
            self._display = None

    def stop(self) -> None:
        if self._display is not None:
            try:
                self._display.update(self.render())
                self._display.stop()
            except Exception:  # noqa: BLE001
                logger.exception("progress display failed to stop")
            self._display = None

    def on_start(self, trial_id: str, params: Mapping[str, Any] | None = None) -> None:
        self.running.add(trial_id)
        shown = " ".join(f"{k}={v}" for k, v in sorted((params or {}).items()))
        self._line(f"trial {trial_id} started ({shown or 'no params'}); {len(self.running)} running")
        self._refresh()

    def on_result(self, trial_id: str, result: Mapping[str, Any]) -> None:
        self.running.discard(trial_id)
        self.done += 1
        if result.get("status") != STATUS_OK:
            self.failed += 1
        if result.get("cached"):
            self.cached += 1
        for b in self.buckets:
            v = float(result.get(metric_name(b)) or 0.0)
            if v > 0 and v > self.best.get(b, (0.0, ""))[0]:
                self.best[b] = (v, str(result.get("engine_label") or ""))
        figures = ", ".join(f"{b} {float(result.get(metric_name(b)) or 0.0):,.0f}" for b in self.buckets)
        outcome = "cached" if result.get("cached") else str(result.get("status"))
        reason = f": {str(result.get('failure_reason'))[:200]}" if result.get("failure_reason") else ""
        self._line(f"trial {trial_id} {outcome}{reason} — {result.get('engine_label') or '?'}: {figures} "
                   f"output tok/s; {self.done} done ({self.failed} failed), {len(self.running)} running")
        self._refresh()

    def on_error(self, trial_id: str) -> None:
        self.running.discard(trial_id)
        self.done += 1
        self.failed += 1
        self._line(f"trial {trial_id} errored; {self.done} done ({self.failed} failed), {len(self.running)} running")
        self._refresh()

    def _line(self, text: str) -> None:
        if not self.live:
            print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    def _refresh(self) -> None:
        if self._display is not None:
            try:
                self._display.update(self.render())
            except Exception:  # noqa: BLE001
                logger.exception("progress display failed")

    def render(self) -> Any:
        from rich.table import Table

        label = " [bold yellow]SIMULATED[/]" if self.simulated else ""
        t = Table(title=f"sweep{label}: {self.done} done ({self.failed} failed, {self.cached} cached), "
                        f"{len(self.running)} running", title_justify="left")
        t.add_column("bucket")
        t.add_column("best output tok/s so far", justify="right")
        t.add_column("config")
        for b in self.buckets:
            v, lab = self.best.get(b, (0.0, "-"))
            t.add_row(b, f"{v:,.0f}" if v else "-", lab)
        return t


def _make_callback(progress: SweepProgress) -> Any:
    from ray.tune import Callback

    class ProgressCallback(Callback):
        def __init__(self, progress: SweepProgress) -> None:
            self.progress = progress

        def setup(self, **info: Any) -> None:
            self.progress.start()

        def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.progress.on_start(trial.trial_id, {k: v for k, v in (trial.config or {}).items()
                                                    if isinstance(v, (str, int, float, bool))})

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            self.progress.on_result(trial.trial_id, result)

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.progress.on_error(trial.trial_id)

        def on_experiment_end(self, trials: list, **info: Any) -> None:
            self.progress.stop()

    return ProgressCallback(progress)


# ----- provenance ------------------------------------------------------------------------------------
def _versions(spec: SweepSpec) -> dict[str, str]:
    out = {}
    for pkg in (("lmdeploy",) if not spec.simulated else ()) + ("ray", "optuna", "mtp-autotune"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    if spec.simulated:
        out["engine"] = f"simulator (profile {spec.space.model})"
    return out


def _most_common(results: Any, column: str) -> str | None:
    if results is None or column not in results.columns:
        return None
    values = results.loc[results["status"] == "ok", column].dropna().astype(str)
    return values.mode().iloc[0] if len(values) else None


def provenance_for(spec: SweepSpec, results: Any = None) -> Provenance:
    """The table's provenance. The GPU and the LMDeploy version come from the rows the trials
    measured (each trial records its own node's: the driver may run on a machine without GPUs or
    LMDeploy, e.g. ``--address ray://...``); this process's are the fallback."""
    versions = _versions(spec)
    if spec.simulated:
        gpu_type, gpu_count = "none (simulated)", 0
    else:
        measured_on = _most_common(results, "gpu_type")
        gpu_type, count = (measured_on, 1) if measured_on else detect_gpus()
        gpu_count = spec.space.tp if count else 0
        if lmdeploy := _most_common(results, "lmdeploy_version"):
            versions["lmdeploy"] = lmdeploy
    return Provenance(
        model=spec.space.model, gpu_type=gpu_type, gpu_count=gpu_count, engine_versions=versions,
        sweep_id=spec.sweep_id, created_at=utc_now_iso(), simulated=spec.simulated,
        workload={"buckets": {b.name: {"workload": b.workload.to_dict(),
                                       "concurrency_levels": list(b.concurrency_levels)} for b in spec.buckets},
                  "steady_state": dict(spec.steady_state) if spec.steady_state else None,
                  "steady_state_min_output_len": spec.steady_state_min_output_len,
                  "sim_time_scale": spec.sim_time_scale},
        objective=f"output_throughput (search: {spec.objective})", constraints=spec.constraints.to_dict(),
    )


# ----- results from Tune ---------------------------------------------------------------------------------
#: Failure reasons of rows the driver writes for a trial without a report of its own.
TRIAL_ERRORED = "trial errored"
REPORTED_NOTHING = "trial reported nothing (stopped or interrupted)"


def rows_from_result_grid(grid: Any, spec: SweepSpec) -> list[dict[str, Any]]:
    """Every trial's rows: Tune's results, else the report the trial saved in the run dir (a driver
    killed between the two), else failed rows saying it reported nothing. Reports of trials Tune's
    restored state does not know at all (created after its last experiment checkpoint) are kept too."""
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for res in grid:
        metrics = res.metrics or {}
        trial_id = metrics.get("trial_id") or Path(str(res.path)).name.removeprefix("trial_")
        seen.add(trial_id)
        if not metrics.get("rows_json"):
            # Reported in the run dir but not in Tune's state (the driver died in between, and the
            # trial was not resumed): its report stands.
            metrics = reported_metrics(spec.run_dir, trial_id) or metrics
        if metrics.get("rows_json"):
            rows.extend(json.loads(metrics["rows_json"]))
            continue
        # A trial that reported nothing has no config in its Result: Tune's params.json has it.
        cfg = res.config or _trial_params(res.path)
        try:
            config = spec.space.config_from_trial_config(cfg) if cfg else None
        except ConfigError:
            config = None
        reason = _error_reason(res.error) if res.error else REPORTED_NOTHING
        rows.extend(failed_rows(sweep_id=spec.sweep_id, trial_id=trial_id, role=str(cfg.get("role") or ROLE_SEARCH),
                                config=config, buckets=spec.buckets, reason=reason[:1500]))
    for trial_id in reported_trial_ids(spec.run_dir):
        if trial_id not in seen and (saved := reported_metrics(spec.run_dir, trial_id)) and saved.get("rows_json"):
            rows.extend(json.loads(saved["rows_json"]))
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


def _cache_seed(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Rows of measured (not cached) trials by engine key, to seed a resumed sweep's cache. Rows the
    driver wrote for a trial that errored or was interrupted are not measurements: seeding them would
    hand the resumed trial its own interruption as a cached result instead of running it."""
    by_key: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if (r.get("engine_key") and not r.get("cached")
                and not str(r.get("failure_reason")).startswith((TRIAL_ERRORED, REPORTED_NOTHING))):
            by_key.setdefault(r["engine_key"], []).append(dict(r))
    return by_key


# ----- running a sweep ------------------------------------------------------------------------------------
def run_sweep(
    spec: SweepSpec,
    *,
    num_trials: int | None,
    time_budget_s: float | None = None,
    resume: bool = False,
    live: bool = True,
    commit_to: Sequence[str | Path] = (),
) -> SweepOutcome:
    """Run (or resume) a sweep on the Ray cluster this process is connected to; write results and the
    routing table. Returns the outcome; an incomplete result is reported in ``outcome.error`` (the
    previous routing table is untouched), never raised."""
    import ray
    from ray import tune

    if not ray.is_initialized():
        raise SweepError("Ray is not initialised; call ray.init() (the CLI does this) before run_sweep")
    t0 = time.monotonic()
    run_dir = Path(spec.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    exp_path = run_dir / EXPERIMENT_NAME
    (run_dir / "sweep.json").write_text(json.dumps(spec.to_dict(), indent=2))
    write_budget(run_dir, num_trials=num_trials, time_budget_s=time_budget_s)

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
            for key, rows in _cache_seed(rows_from_result_grid(tuner.get_results(), spec)).items():
                ray.get(cache.put.remote(key, rows))
        else:
            tuner = tune.Tuner(
                trainable,
                tune_config=tune.TuneConfig(search_alg=_build_search_alg(spec), num_samples=-1,
                                            reuse_actors=False,
                                            trial_dirname_creator=_trial_dirname),
                run_config=tune.RunConfig(
                    name=EXPERIMENT_NAME, storage_path=str(run_dir.resolve()), verbose=0,
                    failure_config=tune.FailureConfig(max_failures=0),
                    callbacks=[_make_callback(progress)],
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
    df = results_frame(rows)
    paths = write_results(df, run_dir)
    table = table_path = None
    error = None
    try:
        table = pick_best(df, spec.buckets, spec.constraints, provenance=provenance_for(spec, df),
                          budget=spec.gpu_budget())
        table_path = Path(spec.run_dir) / "routing_table.json"
        written = routing.commit(table, table_path)
        for extra in dict.fromkeys(Path(p) for p in [*([spec.routing_table] if spec.routing_table else []), *commit_to]):
            if extra.resolve() != table_path.resolve():
                routing.commit(table, extra)
        table = written
    except RoutingTableError as e:
        error = str(e)
    return SweepOutcome(spec=spec, results=df, table=table, table_path=table_path, error=error,
                        results_paths=paths, wall_s=time.monotonic() - t0)


# ----- building a spec from defaults + file + flags -------------------------------------------------------
def new_sweep_id() -> str:
    return f"sweep-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def _has_vision_tower(model: str) -> bool:
    """Does the checkpoint at ``model`` (a local folder) declare a vision tower?"""
    try:
        with open(Path(model) / "config.json", encoding="utf-8") as f:
            return "vision_config" in json.load(f)
    except (OSError, ValueError):
        return False


def short_measurement_warnings(spec: SweepSpec) -> list[str]:
    """Real-engine buckets measured with fewer than :data:`~tuning.buckets.MIN_MEASURED_WAVES` waves:
    allowed (a quick check, a sweep that must fit a time slot), but their figures are not steady state
    and cannot rank close configs, which the person running the sweep should know before trusting the table."""
    if spec.simulated:
        return []
    return [f"{b.name}: {b.workload.num_prompts} prompts at concurrency {b.primary_concurrency} is "
            f"{b.waves:.3g} wave(s); fewer than {MIN_MEASURED_WAVES} is not a steady-state measurement (on an H200 "
            "one wave read 0.77-1.19x the four-wave figure, CV 12-17 %: benchmarks/results/gpu_noise_h200_2026-11-30.md)"
            for b in spec.buckets if b.waves < MIN_MEASURED_WAVES]


def build_spec(args: argparse.Namespace, defaults: Mapping[str, Any] | None = None,
               cluster_gpus: int = 0, cluster_cpus: int = 2) -> SweepSpec:
    """Defaults (``defaults.yaml``; its ``sim`` section when no ``--model``), then ``--space FILE``,
    then flags."""
    d = dict(defaults if defaults is not None else load_defaults())
    simulated = not args.model
    sim = d.get("sim", {}) if simulated else {}
    space_cfg = {**d.get("space", {}), **sim.get("space", {})}
    if args.space:
        space_cfg.update(load_space_file(args.space).get("space", None) or load_space_file(args.space))
    overrides = {
        "speculative": args.speculative, "num_draft_tokens": args.num_draft_tokens,
        "memory_fraction": args.memory_fraction, "max_batch_size": args.max_batch_size,
        "off_backends": args.backends,
    }
    space_cfg.update({k: v for k, v in overrides.items() if v is not None})
    tp = args.tp or sim.get("tp") or d.get("tp", 8)
    if simulated:
        space_cfg.update(engine="sim", model=args.sim_profile or sim.get("profile", SIM_PROFILE), tp=tp)
    else:
        space_cfg.update(engine="lmdeploy", model=args.model, tp=tp)
        if _has_vision_tower(args.model) and "--language-model-only" not in space_cfg.get("extra_flags", ()):
            # Qwen3.5-family checkpoints carry a vision_config; LMDeploy then builds the vision tower
            # (memory, start-up) unless told the workload is text only, which ours is.
            space_cfg["extra_flags"] = [*space_cfg.get("extra_flags", ()), "--language-model-only"]
    if args.session_len:
        space_cfg["session_len"] = args.session_len
    space = SearchSpace.from_mapping(space_cfg).with_baselines()

    bcfg = {**d.get("buckets", {}), **sim.get("buckets", {})}
    if args.buckets:
        bcfg["bounds"] = [int(x) for x in args.buckets.split(",")]
    if args.concurrency:
        bcfg["concurrency_levels"] = [int(x) for x in args.concurrency.split(",")]
    if args.num_prompts:
        bcfg["num_prompts"] = args.num_prompts
    num_prompts = bcfg.get("num_prompts", 256)
    if isinstance(num_prompts, Mapping):
        num_prompts = {int(k): int(v) for k, v in num_prompts.items()}
        bounds = bcfg.get("bounds", [1024, 4096, 8192, 16384])
        missing = [b for b in bounds if b not in num_prompts]
        if missing:
            fallback = max(num_prompts.values())
            num_prompts = {**{b: fallback for b in missing}, **num_prompts}
    buckets = make_buckets(
        bcfg.get("bounds", (1024, 4096, 8192, 16384)), input_len=int(bcfg.get("input_len", 1024)),
        range_ratio=float(bcfg.get("range_ratio", 0.5)), concurrency_levels=bcfg.get("concurrency_levels", (64,)),
        num_prompts=num_prompts, temperature=float(bcfg.get("temperature", 0.0)), seed=int(bcfg.get("seed", 0)),
        dataset=args.dataset or bcfg.get("dataset", "random"), sharegpt_path=args.dataset_path,
        warmup_requests=(args.warmup_requests if args.warmup_requests is not None
                         else int(bcfg.get("warmup_requests", 0 if simulated else GPU_WARMUP_REQUESTS))),
    )
    sweep_cfg = {**d.get("sweep", {}), **sim.get("sweep", {})}
    if simulated:
        resources = {"cpu": 1, "gpu": 0}
        max_conc = args.max_concurrent_trials or min(int(sweep_cfg.get("max_concurrent_trials", 2)),
                                                     max(1, cluster_cpus))
    elif args.share_gpu:
        resources = {"cpu": 1, "gpu": tp}
        # As many as the smallest reservations fit; Ray holds back the ones that do not fit now.
        smallest = min(EngineConfig(model=args.model, memory_fraction=f).gpu_request(share_gpu=True)
                       for f in space.memory_fraction)
        max_conc = args.max_concurrent_trials or max(1, int(cluster_gpus / smallest + 1e-9))
    else:
        resources = {"cpu": 1, "gpu": tp}
        max_conc = args.max_concurrent_trials or max(1, cluster_gpus // tp)
    sweep_id = args.sweep_id or new_sweep_id()
    run_dir = Path(args.run_dir) if args.run_dir else Path("runs") / sweep_id
    steady = d.get("steady_state", {"rel_tolerance": 0.02})
    if args.no_early_stop:
        steady = None
    return SweepSpec(
        sweep_id=sweep_id, run_dir=str(run_dir.resolve()), space=space, buckets=buckets,
        objective=args.objective or sweep_cfg.get("objective", "scalar"),
        seed=args.seed if args.seed is not None else int(sweep_cfg.get("seed", 0)),
        max_concurrent_trials=max_conc, trial_resources=resources,
        sim_time_scale=(args.sim_time_scale or float(sim.get("time_scale", 50.0))) if simulated else None,
        steady_state=steady, steady_state_min_output_len=int(d.get("steady_state_min_output_len", 4096)),
        constraints=Constraints(max_tpot_ms=args.max_tpot_ms, max_ttft_ms=args.max_ttft_ms),
        routing_table=args.routing_table, tokenizer=args.tokenizer or (args.model if not simulated else None),
        n_startup_trials=int(sweep_cfg.get("n_startup_trials", 8)),
        ready_timeout_s=float(sweep_cfg.get("ready_timeout_s", 900.0)),
        share_gpu=bool(args.share_gpu) and not simulated,
        serve_gpus=args.serve_gpus if args.serve_gpus is not None else sweep_cfg.get("serve_gpus"),
        repeats=args.repeats if args.repeats is not None else int(sweep_cfg.get("repeats", 1)),
        burn_in=not simulated and not args.no_burn_in,
    )


def resumed_spec(run_dir: str | Path, *, serve_gpus: int | None = None) -> SweepSpec:
    """The spec saved in ``run_dir/sweep.json``, living in ``run_dir`` (a run dir copied off a
    GPU machine or moved resumes where it is now, not where it was made); ``serve_gpus`` (when
    given) replaces its serving budget, which decides only the choice from the results, so a
    resumed sweep may change it."""
    spec_path = Path(run_dir) / "sweep.json"
    try:
        spec = SweepSpec.from_dict(json.loads(spec_path.read_text()))
    except (OSError, ValueError, KeyError) as e:
        raise SweepError(f"cannot resume from {run_dir}: {spec_path} is missing or invalid ({e})") from None
    spec = dataclasses.replace(spec, run_dir=str(Path(run_dir)))
    return spec if serve_gpus is None else dataclasses.replace(spec, serve_gpus=serve_gpus)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tuning.sweep",
        description="Search LMDeploy MTP engine configs per output-length bucket (Ray Tune + Optuna TPE), "
                    "measure the MTP-off and static-recommendation baselines under the same workloads, and "
                    "commit a routing table. With no arguments: a SIMULATED sweep of the calibrated profile "
                    f"{SIM_PROFILE} on a local Ray (a few minutes on 2 CPU cores, no GPU).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("engine")
    g.add_argument("--model", help="checkpoint path or hub id: sweep LMDeploy on GPUs (omit for the simulator)")
    g.add_argument("--sim-profile", help=f"simulator profile name or JSON path (no --model); default {SIM_PROFILE}")
    g.add_argument("--sim-time-scale", type=float, help="simulator speed-up (figures stay in simulated time); "
                   "default from defaults.yaml")
    g.add_argument("--tp", type=int, help="tensor-parallel degree = GPUs per trial (default 8)")
    g.add_argument("--session-len", type=int, help="--session-len for every engine")
    g.add_argument("--tokenizer", help="tokenizer path for LMDeploy workloads (default: --model)")
    s = p.add_argument_group("search space (narrow/widen the defaults)")
    s.add_argument("--space", help="YAML file with knobs: speculative, num_draft_tokens, memory_fraction, "
                   "max_batch_size, off_backends (lists, or {low, high, step})")
    s.add_argument("--speculative", type=lambda v: [x.strip() for x in v.split(",")],
                   help="MTP switch values, e.g. 'true' or 'false,true'")
    s.add_argument("--num-draft-tokens", type=_int_list, help="LMDeploy draft tokens, e.g. 1,2,3,4 "
                   "(sglang steps=k / draft tokens=k+1 is LMDeploy k)")
    s.add_argument("--memory-fraction", type=_float_list, help="--cache-max-entry-count values, e.g. 0.7,0.8,0.9")
    s.add_argument("--max-batch-size", type=_int_list, help="--max-batch-size values, e.g. 64,128,256")
    s.add_argument("--backends", type=lambda v: v.split(","), help="backends tried with MTP off (pytorch,turbomind)")
    w = p.add_argument_group("workloads")
    w.add_argument("--buckets", help="output-length bucket bounds, e.g. 1024,4096,8192,16384")
    w.add_argument("--concurrency", help="concurrency levels per bucket, primary first, e.g. 64,128")
    w.add_argument("--num-prompts", type=int, help="prompts per bucket (default per bucket from defaults.yaml)")
    w.add_argument("--dataset", choices=["random", "sharegpt"], help="dataset (default random)")
    w.add_argument("--dataset-path", help="ShareGPT JSON for --dataset sharegpt")
    w.add_argument("--warmup-requests", type=int, help="requests sent to each bucket's engine before measuring, "
                   f"not counted (default {GPU_WARMUP_REQUESTS} with --model: a fresh LMDeploy engine's first batches "
                   "pay one-time kernel set-up; 0 on the simulator)")
    w.add_argument("--no-burn-in", action="store_true",
                   help="with --model, do not run the first bucket once unmeasured before measuring (a fresh "
                        "LMDeploy engine's first full-load run was the slower one on 7 of 7 H200 engines)")
    w.add_argument("--repeats", type=int, metavar="R", help="runs of each bucket on the same engine (default 1); "
                   "the lower-median run counts, every run's throughput and their spread go to results.csv "
                   "(tells run-to-run noise from engine-to-engine differences)")
    w.add_argument("--no-early-stop", action="store_true", help="run every request to completion (no "
                   "steady-state early stop)")
    r = p.add_argument_group("search and budgets")
    r.add_argument("--num-trials", type=int, help="trials in total, baselines included (default from defaults.yaml)")
    r.add_argument("--time-budget-s", type=float, help="no new trial starts after this many seconds (running "
                   "trials finish)")
    r.add_argument("--objective", choices=["scalar", "multi"], help="scalar: mean log throughput over buckets; "
                   "multi: one objective per bucket (multi-objective TPE)")
    r.add_argument("--seed", type=int, help="TPE seed")
    r.add_argument("--max-concurrent-trials", type=int, help="parallel trials (default: cluster GPUs // tp; "
                   "simulator: up to 2 per the CPUs)")
    r.add_argument("--share-gpu", action="store_true", help="tp=1 engines share a GPU while their memory "
                   "fractions fit (each reserves fraction + 0.1 of it); they start side by side but are measured "
                   "one at a time per GPU. For models far smaller than the GPU (test checkpoints)")
    r.add_argument("--serve-gpus", type=int, metavar="N", help="the committed table must be servable on N GPUs "
                   "(one replica per engine; with --share-gpu tp=1 engines reserve fraction + 0.1 each): the best "
                   "config per bucket if that fits, else the fitting mix of each bucket's top configs with the best "
                   "mean log throughput. Default: no limit (the summary says how many GPUs the table needs)")
    r.add_argument("--max-tpot-ms", type=float, help="a bucket's chosen config must have median TPOT <= this")
    r.add_argument("--max-ttft-ms", type=float, help="a bucket's chosen config must have median TTFT <= this")
    o = p.add_argument_group("where")
    o.add_argument("--run-dir", help="folder for everything (default runs/<sweep id>/)")
    o.add_argument("--sweep-id", help="sweep id (default sweep-<date>-<random>)")
    o.add_argument("--routing-table", help="commit the routing table here too (default <run-dir>/routing_table.json)")
    o.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted sweep in RUN_DIR (same study, "
                   "no finished trial re-run); --num-trials / --time-budget-s set the new budget")
    o.add_argument("--address", help="join this Ray cluster (e.g. 'auto' or ray://host:10001) instead of a local Ray")
    o.add_argument("--num-cpus", type=int, help="CPUs for the local Ray (default: all)")
    o.add_argument("--no-live", action="store_true", help="no live progress display")
    return p


def _int_list(v: str) -> list[int]:
    return [int(x) for x in v.split(",") if x.strip()]


def _float_list(v: str) -> list[float]:
    return [float(x) for x in v.split(",") if x.strip()]


def print_summary(outcome: SweepOutcome, *, console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    spec = outcome.spec
    tag = "SIMULATED — simulator profile, not a GPU measurement" if spec.simulated else "measured on GPUs"
    df = outcome.results
    n_trials = df["trial_id"].nunique() if not df.empty else 0
    n_failed = df[df["status"] != STATUS_OK]["trial_id"].nunique() if not df.empty else 0
    if outcome.table is not None:
        budget = outcome.table.provenance.gpu_budget
        title = ("Best config per bucket" if budget is None
                 else f"Best config per bucket that fits {budget.gpus} GPU(s){' shared' if budget.share_gpu else ''}")
        t = Table(title=f"{title} ({tag})", title_justify="left")
        for col, just in (("bucket", "left"), ("best config", "left"), ("output tok/s", "right"),
                          ("accept len", "right"), ("vs MTP off", "right"), ("vs static", "right")):
            t.add_column(col, justify=just, no_wrap=col == "best config")  # type: ignore[arg-type]
        for r in summary_rows(outcome.table):
            t.add_row(r["bucket"], r["config"] + ("".join(f"\n  {v}" for v in r["load_variants"])),
                      f"{r['output_throughput']:,.0f}",
                      f"{r['accept_length']:.2f}" if r["accept_length"] else "-",
                      _pct(r["gain_vs_mtp_off"]), _pct(r["gain_vs_static"]))
        console.print(t)
        console.print(serving_line(outcome.table, spec))
        mixed = mixed_line(outcome.table, df)
        if mixed:
            console.print(mixed)
        for note in (budget.notes if budget else ()):
            console.print(f"  - {note}")
        if outcome.error:
            console.print(f"[bold red]Routing table not committed everywhere[/]:\n{outcome.error}")
    else:
        console.print(f"[bold red]No routing table written[/] ({tag}):\n{outcome.error}")
    console.print(f"{n_trials} trials ({n_failed} failed) in {outcome.wall_s:.0f} s; sweep id {spec.sweep_id}")
    console.print(f"results:        {outcome.results_paths[0]}\n                {outcome.results_paths[1]}")
    if outcome.table_path is not None:
        console.print(f"routing table:  {outcome.table_path} (version {outcome.table.version})")
    console.print(f"optuna study:   optuna-dashboard sqlite:///{Path(spec.run_dir) / 'optuna.db'}")
    console.print(f"engine logs:    {Path(spec.run_dir) / 'engine-logs'}")


def serving_line(table: RoutingTable, spec: SweepSpec) -> str:
    """How many GPUs serving ``table`` takes (one replica per engine), whole and shared, so a table the
    deploy target cannot hold shows before ``orchestrator.deploy`` refuses it."""
    n = len(table.distinct_configs())
    if spec.simulated:
        return f"serving:        {n} simulated engine(s), no GPU"
    shareable = any(c.tp == 1 for c in table.distinct_configs().values())
    line = (f"serving:        {n} engine(s), one replica each, need {table.gpus_needed(share_gpu=False)} GPU(s)"
            + (f"; {table.gpus_needed(share_gpu=True)} with --share-gpu" if shareable else ""))
    if spec.serve_gpus is not None:
        line += f" (chosen to fit --serve-gpus {spec.serve_gpus}{' --share-gpu' if spec.share_gpu else ''})"
    return line


def mixed_line(table: RoutingTable, results: Any) -> str | None:
    """The table against the best single config on the buckets in proportion, predicted from this
    sweep's figures (:mod:`tuning.mixed`): whether serving several configs pays at all."""
    from tuning.mixed import predict_for_table

    pred = predict_for_table(table, results)
    if pred is None:
        return None
    key, single = pred.best_single
    label = results.loc[results["engine_key"] == key, "engine_label"].iloc[0]
    return (f"mixed workload: {pred.per_bucket_throughput:,.0f} tok/s with this table vs {single:,.0f} with the best "
            f"single config ({label}) everywhere: {pred.ratio:.2f}x (each bucket's workload once; predicted from "
            "these figures, not measured)")


def _pct(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 100:+.1f}%"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import ray

    defaults = load_defaults()
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "0")
    if not ray.is_initialized():
        if args.address:
            ray.init(address=args.address, log_to_driver=False)
        else:
            ray.init(address="local", num_cpus=args.num_cpus or os.cpu_count() or 2, include_dashboard=False, log_to_driver=False,
                     configure_logging=True, logging_level=logging.WARNING)
    cluster = ray.cluster_resources()
    try:
        if args.resume:
            spec = resumed_spec(args.resume, serve_gpus=args.serve_gpus)
            budget = read_budget(Path(args.resume) / BUDGET_FILE)
            num_trials = args.num_trials or budget.get("num_trials")
            resume = True
        else:
            spec = build_spec(args, defaults, cluster_gpus=int(cluster.get("GPU", 0)),
                              cluster_cpus=int(cluster.get("CPU", 2)))
            sweep_cfg = {**defaults.get("sweep", {}), **(defaults.get("sim", {}).get("sweep", {}) if not args.model else {})}
            num_trials = args.num_trials or int(sweep_cfg.get("num_trials", 40))
            resume = False
        if not spec.simulated and int(cluster.get("GPU", 0)) < spec.space.tp:
            raise SweepError(f"the Ray cluster has {int(cluster.get('GPU', 0))} GPUs but a trial needs tp={spec.space.tp}; "
                             "join a GPU cluster with --address, lower --tp, or omit --model for the simulator")
        from rich.console import Console

        console = Console()
        label = "[bold yellow]SIMULATED[/] " if spec.simulated else ""
        console.print(f"{label}sweep {spec.sweep_id}: {spec.space.size()} distinct configs, "
                      f"{len(spec.buckets)} buckets, budget {num_trials} trials, "
                      f"{spec.max_concurrent_trials} in parallel; run dir {spec.run_dir}")
        for note in short_measurement_warnings(spec):
            console.print(f"[yellow]warning:[/] {note}")
        outcome = run_sweep(spec, num_trials=num_trials, time_budget_s=args.time_budget_s, resume=resume,
                            live=not args.no_live, commit_to=())
        print_summary(outcome, console=console)
        # A table that could not be committed everywhere it was asked for (e.g. the serving path)
        # is a failed sweep too: the caller must not go on to deploy from that path.
        return 0 if outcome.table is not None and outcome.error is None else 3
    except (OrchestratorError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the run dir (or a file in it) can't be written: say which, no traceback
        print(f"error: cannot write the sweep's files: {e}; choose a writable --run-dir with free space",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
