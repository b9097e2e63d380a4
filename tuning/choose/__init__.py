"""Measurements -> routing table and placement plan (pure).

One concept per module; each imports :mod:`tuning.results` (the rows' schema), never the reverse:

- :mod:`~tuning.choose.constraints` — the latency limits a chosen config must meet;
- :mod:`~tuning.choose.noise` — when two measured configs are told apart (pooled noise, intervals);
- :mod:`~tuning.choose.figures` — a results row as a table's figures, gains over the baselines;
- :mod:`~tuning.choose.rank` — one row per config, best first; the config that serves most buckets;
- :mod:`~tuning.choose.budget` — fitting primaries and cells to a GPU budget;
- :mod:`~tuning.choose.cells` — the (sampling band x load level) cells that get a config of their own;
- :mod:`~tuning.choose.pick` — :func:`pick_best`: the table from a results frame;
- :mod:`~tuning.choose.mix` — what a mix of traffic would sustain, per part or per single config;
- :mod:`~tuning.choose.replicas` — whole replicas per config on a fixed pool of GPUs;
- :mod:`~tuning.choose.cap` — the best routing any table could do on a number of replicas;
- :mod:`~tuning.choose.prediction` — a table against single configs on a traffic mix;
- :mod:`~tuning.choose.shared_gpu` — tp=1 engines time-sharing one GPU: memory fit, rate, the noise rule;
- :mod:`~tuning.choose.footprints` — each config's GPU memory, where it is known (simulated configs);
- :mod:`~tuning.choose.plan` — a table's serving plan on its GPU budget;
- :mod:`~tuning.choose.table` — :func:`choose_table`: the table the sweep commits;
- :mod:`~tuning.choose.decision` — what the sweep measures again before it commits;
- :mod:`~tuning.choose.commit` — :func:`commit_table`, the one place a chosen table is written.
"""
from __future__ import annotations

from tuning.choose.budget import BUDGET_CANDIDATES, CELL_DROPPED
from tuning.choose.cells import (
    CELL_MIN_GAIN,
    BucketChoice,
    CellMeasurement,
    Undecided,
    cell_measurements,
    choose_cells,
    undecided_cells,
)
from tuning.choose.commit import commit_table, table_targets
from tuning.choose.constraints import NO_CONSTRAINTS, Constraints
from tuning.choose.decision import ROLE_DECIDE, DecisionPlan, plan_decision
from tuning.choose.figures import gains_over, row_figures
from tuning.choose.mix import (
    MixedPrediction,
    mix_parts,
    mixed_throughput,
    part_rates,
    predict,
    predict_for_table,
    predict_mix,
)
from tuning.choose.noise import pooled_noise, throughput_interval, within_noise
from tuning.choose.pick import IncompleteResultsError, pick_best
from tuning.choose.plan import plan_replicas
from tuning.choose.prediction import predict_on_engines, predict_on_mix
from tuning.choose.rank import consolidate, measured_at_primary
from tuning.choose.replicas import ServingPlan, plan_serving
from tuning.choose.shared_gpu import (
    EngineFootprint,
    SharedGpuFitError,
    SharedGpuPlan,
    check_fits_one_gpu,
    plan_shared_gpu,
)
from tuning.choose.table import choose_table, no_worse_than_one_config, pick_for

__all__ = [
    "BUDGET_CANDIDATES",
    "CELL_DROPPED",
    "CELL_MIN_GAIN",
    "NO_CONSTRAINTS",
    "ROLE_DECIDE",
    "BucketChoice",
    "CellMeasurement",
    "Constraints",
    "DecisionPlan",
    "EngineFootprint",
    "IncompleteResultsError",
    "MixedPrediction",
    "ServingPlan",
    "SharedGpuFitError",
    "SharedGpuPlan",
    "Undecided",
    "cell_measurements",
    "check_fits_one_gpu",
    "choose_cells",
    "choose_table",
    "commit_table",
    "consolidate",
    "gains_over",
    "measured_at_primary",
    "mix_parts",
    "mixed_throughput",
    "no_worse_than_one_config",
    "part_rates",
    "pick_best",
    "pick_for",
    "plan_decision",
    "plan_replicas",
    "plan_serving",
    "plan_shared_gpu",
    "pooled_noise",
    "predict",
    "predict_for_table",
    "predict_mix",
    "predict_on_engines",
    "predict_on_mix",
    "row_figures",
    "table_targets",
    "throughput_interval",
    "undecided_cells",
    "within_noise",
]
