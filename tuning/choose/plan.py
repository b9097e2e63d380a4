"""A table's serving plan on its GPU budget (:func:`plan_replicas`): the replicas per engine that the
traffic's work asks for, and the cells and primaries that pay for the replicas they take.

Why apart from the per-cell choice: a cell that is faster on its own part can still lose overall when
it takes a replica the rest of the traffic needed more (:mod:`tuning.choose.replicas`).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator import table as routing
from orchestrator.config import EngineConfig
from orchestrator.table import RoutingTable
from tuning.buckets import Bucket
from tuning.choose.budget import CELL_DROPPED
from tuning.choose.cells import CELL_MIN_GAIN, BucketChoice, cell_measurements
from tuning.choose.figures import gains_over
from tuning.choose.footprints import footprint_of
from tuning.choose.mix import bucket_tokens
from tuning.choose.noise import pooled_noise
from tuning.choose.replicas import choices_from_routes, plan_serving
from tuning.choose.shared_gpu import SharedGpuPlan, plan_shared_gpu

__all__ = ["plan_replicas"]


def plan_replicas(table: RoutingTable, results: Any, buckets: Sequence[Bucket], traffic: Any = None) -> RoutingTable:
    """``table`` on its budget's GPUs as :func:`tuning.choose.replicas.plan_serving` plans it: cells and bucket
    primaries that do not pay for the replicas they take handed to configs it keeps, replicas per engine
    in ``provenance.gpu_budget.replicas``, what changed and the predicted mix in its notes. A table whose
    mix the results do not cover is returned with one replica each and a note saying why.

    With ``share_gpu`` the engines may also time-share each GPU (:func:`tuning.choose.shared_gpu.plan_shared_gpu`:
    configs with a known footprint, :func:`tuning.choose.footprints.footprint_of`, that fit one GPU together):
    that plan replaces the whole-replica one only when it is proposed (beyond the noise and
    :data:`~tuning.choose.cells.CELL_MIN_GAIN` over the best single config) and predicts more than it;
    ``gpu_budget.shared`` then names its engines. Otherwise a note says why not."""

    budget = table.provenance.gpu_budget
    assert budget is not None

    def noted(*notes: str, replicas: dict[str, int] | None = None, buckets: Any = None,
              shared: tuple[str, ...] = ()) -> RoutingTable:
        # A plan re-decides every part of the mix, so the fitting step's dropped cells are moot then.
        kept = budget.notes if buckets is None else tuple(n for n in budget.notes if not n.endswith(CELL_DROPPED))
        new_budget = budget.model_copy(update={"notes": (*kept, *notes), "replicas": replicas or {}, "shared": shared})
        return table.model_copy(update={"provenance": table.provenance.model_copy(update={"gpu_budget": new_budget}),
                                        **({"buckets": buckets} if buckets is not None else {})})

    measured = [m for b in buckets for m in cell_measurements(results, b)]
    primary_band = routing.band_of(buckets[0].primary_temperature)
    levels = sorted({m.in_flight for m in measured})
    if traffic is not None:
        shares = traffic.cell_shares(table, by="tokens")
        mix = "the traffic mix"
    else:
        tokens = bucket_tokens(results, {b.name: b.workload.num_prompts for b in buckets})
        bands = sorted({m.band for m in measured})
        shares = {(b, band): n / len(bands) for b, n in tokens.items() for band in bands}
        mix = "the buckets' workloads in proportion" + (f", {'/'.join(bands)} alike" if len(bands) > 1 else "")
    configs = {**{m.engine_key: EngineConfig.from_dict(m.config) for m in measured}, **table.distinct_configs()}

    def fits(replicas: Any) -> bool:
        return budget.fits(configs[k] for k, n in replicas.items() for _ in range(n))

    choices = {b.name: BucketChoice.of_route(b) for b in table.buckets}
    labels = {k: c.label() for k, c in configs.items()}
    band = primary_band.name if primary_band else "greedy"
    try:
        plan = plan_serving(measured, choices, shares, in_flight={level: 1.0 for level in levels},
                            primary_band=band, fits=fits, min_gain=CELL_MIN_GAIN, labels=labels)
    except ValueError as e:
        return noted(f"replicas not planned: {e} (one replica each)")
    shared = None
    if budget.share_gpu:
        footprints = {k: fp for k, c in configs.items() if (fp := footprint_of(c)) is not None}
        shared = plan_shared_gpu(measured, shares, in_flight={level: 1.0 for level in levels}, footprints=footprints,
                                 gpus=budget.gpus, noise=pooled_noise(results), min_gain=CELL_MIN_GAIN, labels=labels)
    if shared is not None and shared.proposed and shared.rate > plan.throughput * (1 + 1e-9):
        return _on_shared_gpus(table, shared, choices_from_routes(shared.routes, measured, choices, band),
                               noted, f"for {mix} over load levels {'/'.join(map(str, levels))}", plan.throughput)
    buckets = []
    for b in table.buckets:
        c = plan.choices[b.name]
        update: dict[str, Any] = {"cells": c.cells}
        if c.primary_key != b.engine_config().key():
            figures = c.primary_figures
            update |= {"config": dict(c.primary_config), "figures": figures,
                       "gains": gains_over(figures, b.baselines)}
        buckets.append(b.model_copy(update=update))
    single = (f"; the best single config on them {plan.single[1]:,.0f} ({plan.ratio:.2f}x)" if plan.single else "")
    summary = (f"replicas planned on {budget.gpus} GPU(s) for {mix} over load levels {'/'.join(map(str, levels))}: "
               + ", ".join(f"{configs[k].label()} x{n}" for k, n in plan.replicas.items())
               + f"; predicted {plan.throughput:,.0f} tok/s{single} (from these figures, not measured)")
    sharing = () if shared is None or len(shared.work) < 2 else (f"shared GPU not planned: {shared.reason}",)
    return noted(summary, *plan.notes, *sharing, replicas=dict(plan.replicas), buckets=tuple(buckets))


def _on_shared_gpus(table: RoutingTable, shared: SharedGpuPlan, choices: dict[str, BucketChoice], noted: Any,
                    mix: str, whole_rate: float) -> RoutingTable:
    """``table`` routed as ``shared`` routes the mix, with one replica of each of its engines on every GPU
    of the budget, those engines named in ``gpu_budget.shared`` and the plan's prediction in its notes."""
    buckets = []
    for b in table.buckets:
        c = choices[b.name]
        update: dict[str, Any] = {"cells": c.cells}
        if c.primary_key != b.engine_config().key():
            update |= {"config": dict(c.primary_config), "figures": c.primary_figures,
                       "gains": gains_over(c.primary_figures, b.baselines)}
        buckets.append(b.model_copy(update=update))
    summary = (f"engines share each GPU {mix}: {shared.reason}; on whole replicas the best plan made "
               f"{whole_rate:,.0f} (time split where the work is; from these figures, not measured)")
    return noted(summary, replicas={k: shared.gpus for k in shared.engines}, buckets=tuple(buckets),
                 shared=shared.engines)
