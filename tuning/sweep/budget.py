"""The sweep's budget: how many trials, until when new trials may start, and until when any measure.

The sweep writes it to ``<run_dir>/budget.json`` (``--num-trials``, ``--time-budget-s``,
``--stop-after-s``; a resume rewrites it) and reads it where the decisions are made: the searcher before
each suggestion, and each trial right before it starts its engine. Tune creates trials ahead of the
resources they wait for, so a trial suggested in time can get its GPU share long after the time budget
ran out; the second check is what keeps ``--time-budget-s`` meaning "no new trial starts after this".

The time budget leaves a tail: engines started before it still measure, one at a time on a shared GPU
(a decide phase starts several at once). ``--stop-after-s`` bounds the whole sweep: each engine checks
it before every round (:func:`tuning.sweep.measure.measure_buckets`), stops there, and the sweep commits
its table from the rounds measured, so a caller with a hard deadline of its own (a lease) gets a table
rather than a killed sweep.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.errors import OrchestratorError
from orchestrator.fsutil import atomic_write_text

__all__ = ["BUDGET_FILE", "StoppedAtLimit", "TimeBudgetSpent", "check_time_budget", "read_budget", "stop_reached",
           "time_budget_spent", "write_budget"]

BUDGET_FILE = "budget.json"


class TimeBudgetSpent(OrchestratorError):
    """A trial got its resources after the sweep's time budget ran out and did not start its engine.

    Raised out of the trial, so Tune records the trial as errored: it has no result, and a resumed
    sweep (``--resume``, which restarts errored trials) runs it under the new budget. Code that turns
    other project errors into a failed trial's result lets this one through."""


class StoppedAtLimit(TimeBudgetSpent):
    """The sweep's hard limit (``--stop-after-s``) came before a started engine's first round: nothing was
    measured. Like a start the time budget refused, the trial ends errored without a result (it is no
    result about the config), and a resumed sweep runs it."""


def write_budget(run_dir: str | Path, *, num_trials: int | None, time_budget_s: float | None,
                 stop_after_s: float | None = None) -> dict[str, Any]:
    now = time.time()
    budget = {"num_trials": num_trials,
              "deadline": (now + time_budget_s) if time_budget_s else None,
              "time_budget_s": time_budget_s,
              "stop_at": (now + stop_after_s) if stop_after_s else None,
              "stop_after_s": stop_after_s, "written_at": now}
    atomic_write_text(Path(run_dir) / BUDGET_FILE, json.dumps(budget, indent=2))
    return budget


def read_budget(path: str | Path) -> dict[str, Any]:
    """The budget in ``path`` (a run dir's ``budget.json``); empty if there is none to read."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def time_budget_spent(budget: Mapping[str, Any]) -> bool:
    """Whether ``budget`` (as :func:`read_budget` returns it) has a time budget, and it has run out."""
    deadline = budget.get("deadline")
    return deadline is not None and time.time() >= deadline


def stop_reached(budget: Mapping[str, Any]) -> bool:
    """Whether ``budget`` has a hard limit (``--stop-after-s``), and it has been reached: no round starts."""
    stop_at = budget.get("stop_at")
    return stop_at is not None and time.time() >= stop_at


def check_time_budget(run_dir: str | Path) -> None:
    """Raise :class:`TimeBudgetSpent` if the sweep's time budget has run out, or its hard limit has been
    reached (no new engine may start)."""
    budget = read_budget(Path(run_dir) / BUDGET_FILE)
    if stop_reached(budget):
        raise StoppedAtLimit(
            f"not started: the sweep's hard limit (--stop-after-s {budget.get('stop_after_s'):g}) was reached before "
            "this trial got its resources; --resume RUN_DIR runs it")
    if time_budget_spent(budget):
        ran_out = _dt.datetime.fromtimestamp(budget["deadline"], _dt.timezone.utc).strftime("%H:%M:%S UTC")
        raise TimeBudgetSpent(
            f"not started: the sweep's time budget (--time-budget-s {budget.get('time_budget_s'):g}) ran out at "
            f"{ran_out}, before this trial got its resources; --resume RUN_DIR with a larger --time-budget-s runs it")
