"""The sweep: search engine configs per output-length bucket with Ray Tune + Optuna, measure the
baselines under the same workloads, and commit a routing table (``python -m tuning.sweep``).

One concept per module:

- :mod:`~tuning.sweep.spec` — :class:`SweepSpec` (validated; CLI flags + defaults -> spec);
- :mod:`~tuning.sweep.space` — the define-by-run search space and the baselines;
- :mod:`~tuning.sweep.budget` — the trial / time budget in the run dir, extendable on resume;
- :mod:`~tuning.sweep.measure` — :class:`MeasurePlan` and measuring one config on every bucket, no Ray;
- :mod:`~tuning.sweep.records` — the typed rows and report a trial returns;
- :mod:`~tuning.sweep.trial` — the Tune trainable around the measurement;
- :mod:`~tuning.sweep.actors` — the result cache and the per-GPU lease (Ray actors);
- :mod:`~tuning.sweep.searcher` — the budgeted searcher over an ``optuna.Study`` (ask/tell);
- :mod:`~tuning.sweep.runner` — the Tune run, its results, the commit of the table :mod:`tuning.choose` chose;
- :mod:`~tuning.sweep.decide` — measuring again what the choice left within noise;
- :mod:`~tuning.sweep.provenance`, :mod:`~tuning.sweep.progress`, :mod:`~tuning.sweep.summary`,
  :mod:`~tuning.sweep.cli`.

Names are imported lazily (importing ``tuning.sweep`` or one of its light modules does not start
Ray Tune, and :mod:`tuning.choose` can import the space's roles without a cycle).
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "GPU_BURN_IN_S",
    "GPU_ROUNDS",
    "GPU_WARMUP_REQUESTS",
    "MeasurePlan",
    "SweepError",
    "SweepOutcome",
    "SweepSpec",
    "build_spec",
    "load_defaults",
    "main",
    "measure_config",
    "mixed_line",
    "next_commands",
    "print_summary",
    "provenance_for",
    "resumed_spec",
    "run_sweep",
    "serving_line",
    "short_measurement_warnings",
]

_HOMES = {
    "GPU_BURN_IN_S": "spec", "GPU_ROUNDS": "spec", "GPU_WARMUP_REQUESTS": "spec", "SweepError": "spec", "SweepSpec": "spec", "build_spec": "spec",
    "load_defaults": "spec", "resumed_spec": "spec", "short_measurement_warnings": "spec",
    "MeasurePlan": "measure", "measure_config": "measure",
    "SweepOutcome": "runner", "run_sweep": "runner",
    "mixed_line": "summary", "next_commands": "summary", "print_summary": "summary", "serving_line": "summary",
    "provenance_for": "provenance",
    "main": "cli",
}
_ALIASES = {"_parser": ("cli", "parser")}  # the name older callers import


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    if name in _ALIASES:
        module, attr = _ALIASES[name]
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
