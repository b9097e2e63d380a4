"""The sweep's searcher: an ``optuna.Study`` driven through Optuna's ask/tell API, as a Tune ``Searcher``.

The study (TPE, seeded; in ``<run_dir>/optuna.db``, so ``optuna-dashboard sqlite:///<run_dir>/optuna.db``
opens it) gets the baselines first through ``study.enqueue_trial``, tagged by ``user_attrs`` that the
define-by-run space (:meth:`tuning.sweep.space.SearchSpace.__call__`) returns as constants. Each Tune
suggestion is ``study.ask()`` + the define-by-run space; each completion is ``study.tell()``. Around
that, :class:`BudgetedSearch` adds what Tune's stock Optuna searcher does not have: budgets that a
resume can extend, dedupe by engine command, and holding search trials back while a baseline runs on a
shared GPU.
"""
from __future__ import annotations

import logging
import pickle
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError
from tuning.sweep.budget import BUDGET_FILE, read_budget, stop_reached, time_budget_spent
from tuning.sweep.space import ROLE_SEARCH, SearchSpace

__all__ = ["BudgetedSearch", "ResumableSearchGenerator", "build_search_alg", "open_study", "study_name"]

logger = logging.getLogger(__name__)

from ray.tune.search import ConcurrencyLimiter, Searcher, SearchGenerator


class BudgetedSearch(Searcher):
    """A Tune searcher over an ``optuna.Study`` (ask/tell) with budgets, dedupe and baselines first.

    Budgets: stops suggesting once the trial or time budget (re-read from ``budget.json`` every time)
    is spent. Trials are counted in the study itself (trials asked of it, minus the duplicates below),
    so the count survives restarts.

    Dedupe: a suggestion whose engine command was already measured in this sweep is told to the study
    at once with the measured result (tagged ``duplicate_of``; pruned when its twin is still running,
    which TPE ignores) and the study is asked again, so a Tune trial — and the budget — goes to a
    config not yet measured. After ``max_dedupe_attempts`` the duplicate is run anyway; the trial then
    reports the cached result (:class:`tuning.sweep.actors.ResultCache`).

    ``named_first`` (shared GPUs): while a named point (a baseline) is suggested and not complete,
    no search trial is suggested. Ray grants GPU shares to whichever request fits, so a baseline's
    0.9-GPU reservation would wait behind every small search trial that keeps fitting — and without
    both baselines no table is committed. The named points themselves are suggested together: two
    0.9 shares still run one after the other (Ray grants one at a time), while baselines at a small
    fraction start side by side, so their start-ups overlap (each is still measured alone, under the
    sweep's lease).

    Args:
        study: the study to drive (its sampler decides; its storage keeps every trial).
        space: the define-by-run space; also maps a config to its engine command for dedupe.
        budget_path: the sweep's ``budget.json``.
        metric: ``"score"``, or one metric per bucket for a multi-objective study.
        mode: ``"max"`` (or one per metric).
        named_first: hold search trials while a named point is open (see above).
    """

    max_dedupe_attempts = 20

    def __init__(self, study: Any, space: SearchSpace, budget_path: str | Path, *, metric: str | list[str],
                 mode: str | list[str], named_first: bool = False) -> None:
        super().__init__(metric=metric, mode=mode)
        self.study = study
        self.space = space
        self.budget_path = str(budget_path)
        self.named_first = named_first
        self.trial_numbers: dict[str, int] = {}  # Tune trial id -> Optuna trial number
        self.configs: dict[str, dict[str, Any]] = {}  # Tune trial id -> the config it was given
        self.known: dict[str, dict[str, Any]] = {}  # engine key -> measured objective figures
        self.running: dict[str, str] = {}  # trial id -> engine key, suggested and not complete
        self.named_open: set[str] = set()  # named points suggested and not complete
        self._named_open_checked = True  # False after a restore, until checked against the study

    # ----- Tune's Searcher interface ------------------------------------------------------------------
    def set_search_properties(self, metric: Any, mode: Any, config: dict, **spec: Any) -> bool:
        """The space and objective are fixed by the sweep's spec; Tune's own (none given) are not used."""
        return True

    def suggest(self, trial_id: str) -> dict | None:
        budget = read_budget(self.budget_path)
        if time_budget_spent(budget) or stop_reached(budget):
            return Searcher.FINISHED
        if trial_id in self.configs:  # asked again for a trial it already has a config for
            return dict(self.configs[trial_id])
        n = budget.get("num_trials")
        if n is not None and self._asked() >= n:
            return Searcher.FINISHED
        if self.named_first and self.named_open and not self._named_open_checked:
            self._drop_finished_named()
        if self._search_held():
            return None  # not now: Tune asks again
        for attempt in range(self.max_dedupe_attempts):
            trial = self.study.ask()
            config = self._config_of(trial)
            key = self._key(config)
            known = self.known.get(key) if key else None
            running = key is not None and key in self.running.values()
            if (known is None and not running) or attempt == self.max_dedupe_attempts - 1:
                self.trial_numbers[trial_id] = trial.number
                self.configs[trial_id] = config
                if key:
                    self.running[trial_id] = key
                if config.get("role", ROLE_SEARCH) != ROLE_SEARCH:
                    self.named_open.add(trial_id)
                return dict(config)
            trial.set_user_attr("duplicate_of", key)
            # Measured: tell the study the measured value. Being measured: pruned (TPE ignores it).
            self._tell(trial.number, known, error=False)
            if self._search_held():
                return None  # the duplicate was the last baseline: the hold applies again
        return None  # unreachable

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """Nothing: a trial reports once, at its end, and :meth:`on_trial_complete` tells the study."""

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        self.running.pop(trial_id, None)
        self.named_open.discard(trial_id)
        if result and result.get("engine_key") and not error:
            keep = {k: v for k, v in result.items() if k == "score" or k.startswith("tput_")}
            self.known.setdefault(result["engine_key"], keep)
        number = self.trial_numbers.get(trial_id)
        if number is None:
            logger.warning("trial %s completed but was never suggested by this searcher; not told", trial_id)
            return
        self._tell(number, result, error=error)

    # ----- state, saved with Tune's experiment ---------------------------------------------------------
    def get_state(self) -> dict:
        return {"trial_numbers": dict(self.trial_numbers), "configs": dict(self.configs), "known": dict(self.known),
                "running": dict(self.running), "named_open": sorted(self.named_open)}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """A resumed sweep keeps deduplicating against what was measured, and keeps holding back
        search trials while a baseline that Tune restarts is open (else a restarted 0.9-GPU baseline
        waits behind small trials again). The baselines that finished after the last save (the study
        records a completion at once, Tune's saved state only every few seconds) are dropped at the
        first suggestion."""
        self.trial_numbers = dict(state.get("trial_numbers", {}))
        self.configs = {k: dict(v) for k, v in state.get("configs", {}).items()}
        self.known = dict(state.get("known", {}))
        self.running = dict(state.get("running", {}))
        self.named_open = set(state.get("named_open", ()))
        self._named_open_checked = False

    def save(self, checkpoint_path: str) -> None:
        """The state and the study handle (its storage URL; the trials themselves live in the storage)."""
        with open(checkpoint_path, "wb") as f:
            pickle.dump({"state": self.get_state(), "study": self.study}, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            saved = pickle.load(f)
        self.study = saved["study"]
        self.set_state(saved["state"])

    # ----- helpers ------------------------------------------------------------------------------------
    def _config_of(self, trial: Any) -> dict[str, Any]:
        """The Tune config of an asked trial: its suggestions, overridden by what the define-by-run
        space returns (rounded values, and a named point's role and flags)."""
        returned = self.space(trial) or {}
        return {**trial.params, **returned}

    def _key(self, config: Mapping[str, Any]) -> str | None:
        try:
            return self.space.config_from_trial_config(config).key()
        except ConfigError:
            return None

    def _asked(self) -> int:
        from optuna.trial import TrialState

        return sum(1 for t in self.study.get_trials(deepcopy=False)
                   if t.state != TrialState.WAITING and "duplicate_of" not in t.user_attrs)

    def _tell(self, number: int, result: Mapping[str, Any] | None, *, error: bool) -> None:
        """Tell the study how trial ``number`` ended: its objective value(s) when ``result`` has them,
        else failed (an error) or pruned. A trial the study has finished already is skipped: the study
        commits at once, Tune's experiment state every few seconds, so a resumed sweep can restart —
        and re-report — a trial whose result the study has."""
        from optuna.trial import TrialState

        values: Any = None
        if result:
            if isinstance(self.metric, list):
                values = [result.get(m) for m in self.metric]
                values = None if any(v is None for v in values) else values
            else:
                values = result.get(self.metric)
        state = TrialState.COMPLETE if values is not None else (TrialState.FAIL if error else TrialState.PRUNED)
        try:
            self.study.tell(number, values if state == TrialState.COMPLETE else None, state=state,
                            skip_if_finished=True)
        except ValueError as e:  # e.g. a NaN objective: the trial stays out of the model
            logger.warning("trial %d not told to the study: %s", number, e)

    def _search_held(self) -> bool:
        """Whether the next suggestion would be a search trial while a baseline is still open (``named_first``)."""
        return self.named_first and bool(self.named_open) and not self._named_waiting()

    def _named_waiting(self) -> bool:
        """Whether the study's next trial is another baseline: the named points wait in the study
        (enqueued, handed out in order), and a named point of the search role is a search trial."""
        from optuna.trial import TrialState

        waiting = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        return bool(waiting) and min(waiting, key=lambda t: t.number).user_attrs.get("role", ROLE_SEARCH) != ROLE_SEARCH

    def _drop_finished_named(self) -> None:
        """Keep only the open baselines whose study trial is still running."""
        from optuna.trial import TrialState

        self._named_open_checked = True
        running = {t.number for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        self.named_open = {tid for tid in self.named_open if self.trial_numbers.get(tid) in running}


class ResumableSearchGenerator(SearchGenerator):
    """Tune marks its search generator finished once the searcher says so and saves that in its state;
    a resumed sweep with a larger budget must ask again, so "finished" is not restored (the budgeted
    searcher says FINISHED again at once if the budget is still spent)."""

    def set_state(self, state: dict) -> None:
        super().set_state({**state, "finished": False})


# ----- building it from a spec -----------------------------------------------------------------------------
def study_name(sweep_id: str) -> str:
    return f"mtp-sweep-{sweep_id}"


def open_study(spec: Any) -> Any:
    """The sweep's study in ``<run_dir>/optuna.db`` (created, or loaded on resume), seeded TPE over
    the define-by-run space; a new one gets the spec's named points (baselines first) enqueued."""
    import optuna

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    storage = optuna.storages.RDBStorage(f"sqlite:///{Path(spec.run_dir).resolve() / 'optuna.db'}")
    sampler = optuna.samplers.TPESampler(seed=spec.seed, multivariate=True, group=True,
                                         constant_liar=spec.max_concurrent_trials > 1,
                                         n_startup_trials=spec.n_startup_trials)
    directions: dict[str, Any] = ({"directions": ["maximize"] * len(spec.buckets)} if spec.objective == "multi"
                                  else {"direction": "maximize"})
    study = optuna.create_study(storage=storage, sampler=sampler, study_name=study_name(spec.sweep_id),
                                load_if_exists=True, **directions)
    if not study.get_trials(deepcopy=False):  # resumed: already enqueued (and probably run)
        for p in spec.space.points:
            suggested, fixed = spec.space.split_point(p.params)
            study.enqueue_trial(suggested, user_attrs={"role": p.role, "extra_flags": list(p.extra_flags),
                                                       "fixed": fixed}, skip_if_exists=False)
    return study


def build_search_alg(spec: Any) -> ResumableSearchGenerator:
    """What Tune gets as ``search_alg``: the budgeted searcher over the sweep's study, limited to
    ``spec.max_concurrent_trials`` at once."""
    if spec.objective == "multi":
        metric: Any = spec.metrics()
        mode: Any = ["max"] * len(metric)
    else:
        metric, mode = "score", "max"
    budgeted = BudgetedSearch(open_study(spec), spec.space, Path(spec.run_dir) / BUDGET_FILE, metric=metric,
                              mode=mode, named_first=spec.share_gpu)
    return ResumableSearchGenerator(ConcurrencyLimiter(budgeted, max_concurrent=spec.max_concurrent_trials))
