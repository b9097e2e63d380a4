"""A mixed-workload driver (GuideLLM's split: workload, scheduler, backend, report): keep the
concurrency a :class:`~tuning.traffic.LoadProfile` asks for over time, draw each request's class from a
:class:`~tuning.traffic.TrafficMix` with a seed, stream completions, record each request
(:class:`DriveRecord`) and report goodput per phase. ``python -m tuning.drive --help`` is the CLI.

Modules: :mod:`.workload` (what each request asks for), :mod:`.scheduler` (when requests start),
:mod:`.backend` (HTTP), :mod:`.runner` (one drive), :mod:`.records` (typed results), :mod:`.report`
(goodput per phase, pure), :mod:`.summary` (the report as text), :mod:`.cli`.
"""
from __future__ import annotations

from tuning.drive.backend import OpenAIBackend, Outcome, lateness_between
from tuning.drive.errors import DriveError
from tuning.drive.records import DriveRecord, DriveResult, EngineLateness
from tuning.drive.report import MLPERF_SERVER_SLO, PhaseFigures, Slo, overall_figures, phase_figures, tokens_in_window
from tuning.drive.runner import drive, run_drive
from tuning.drive.scheduler import Dispatcher, Launch
from tuning.drive.summary import MAX_LAG_SHARE, kept_schedule, max_lag_s, report_lines
from tuning.drive.workload import DrawnRequest, RequestDraw

__all__ = [
    "MAX_LAG_SHARE",
    "MLPERF_SERVER_SLO",
    "Dispatcher",
    "DrawnRequest",
    "DriveError",
    "DriveRecord",
    "DriveResult",
    "EngineLateness",
    "Launch",
    "OpenAIBackend",
    "Outcome",
    "PhaseFigures",
    "RequestDraw",
    "Slo",
    "drive",
    "kept_schedule",
    "lateness_between",
    "max_lag_s",
    "overall_figures",
    "phase_figures",
    "report_lines",
    "run_drive",
    "tokens_in_window",
]
