"""Sweep progress: trials done / running / failed and the best figure so far per bucket.

A Tune callback feeds :class:`SweepProgress`; its rich live table is one display, and one line per
trial (``live=False``: logs, CI, a device call's output) is the other. A display error is logged and
never fails the sweep.
"""
from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tuning.results import STATUS_OK
from tuning.sweep.records import metric_name

__all__ = ["SweepProgress", "make_callback"]

logger = logging.getLogger(__name__)


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


def make_callback(progress: SweepProgress) -> Any:
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
