"""The sweep's budget: how many trials, and until when new trials may start.

The sweep writes it to ``<run_dir>/budget.json`` (``--num-trials``, ``--time-budget-s``; a resume
rewrites it) and reads it where the decisions are made: the searcher before each suggestion, and each
trial right before it starts its engine. Tune creates trials ahead of the resources they wait for, so a
trial suggested in time can get its GPU share long after the time budget ran out; the second check is
what keeps ``--time-budget-s`` meaning "no new trial starts after this".
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

__all__ = ["BUDGET_FILE", "TimeBudgetSpent", "check_time_budget", "read_budget", "time_budget_spent", "write_budget"]

BUDGET_FILE = "budget.json"


class TimeBudgetSpent(OrchestratorError):
    """A trial got its resources after the sweep's time budget ran out and did not start its engine.

    Raised out of the trial, so Tune records the trial as errored: it has no result, and a resumed
    sweep (``--resume``, which restarts errored trials) runs it under the new budget. Code that turns
    other project errors into a failed trial's result lets this one through."""


def write_budget(run_dir: str | Path, *, num_trials: int | None, time_budget_s: float | None) -> dict[str, Any]:
    budget = {"num_trials": num_trials,
              "deadline": (time.time() + time_budget_s) if time_budget_s else None,
              "time_budget_s": time_budget_s, "written_at": time.time()}
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


def check_time_budget(run_dir: str | Path) -> None:
    """Raise :class:`TimeBudgetSpent` if the sweep's time budget has run out (no new engine may start)."""
    budget = read_budget(Path(run_dir) / BUDGET_FILE)
    if time_budget_spent(budget):
        ran_out = _dt.datetime.fromtimestamp(budget["deadline"], _dt.timezone.utc).strftime("%H:%M:%S UTC")
        raise TimeBudgetSpent(
            f"not started: the sweep's time budget (--time-budget-s {budget.get('time_budget_s'):g}) ran out at "
            f"{ran_out}, before this trial got its resources; --resume RUN_DIR with a larger --time-budget-s runs it")
