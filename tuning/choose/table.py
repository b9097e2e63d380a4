"""The routing table the sweep commits: a decision made from the results frame alone, apart from
committing it (:mod:`tuning.choose.commit`).

:func:`choose_table` is pure (results in, table out, nothing written). An incomplete sweep raises
:class:`~tuning.choose.pick.IncompleteResultsError` from the choice, before anything is written, so a
good table already at a target stays.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.config import API_DEFAULT_TEMPERATURE, EngineConfig
from orchestrator.table import Provenance, RoutingTable
from tuning.buckets import Bucket
from tuning.choose.cells import CELL_MIN_GAIN
from tuning.choose.figures import gains_over
from tuning.choose.pick import pick_best
from tuning.choose.plan import plan_replicas
from tuning.choose.prediction import predict_on_mix
from tuning.choose.rank import measured_at_primary

if TYPE_CHECKING:
    from tuning.sweep.spec import SweepSpec

__all__ = ["choose_table", "no_worse_than_one_config", "pick_for"]


def choose_table(results: Any, spec: SweepSpec, provenance: Provenance, traffic: Any = None) -> RoutingTable:
    """The routing table ``spec`` asks for from ``results`` (a results frame): each bucket's best
    config under the spec's constraints, fitted to its serving budget when it has one. With a budget,
    whole replicas are planned on its GPUs for ``traffic`` (a :class:`tuning.traffic.TrafficMix`; without
    one, the buckets' workloads in proportion and the measured sampling bands alike) and the cells
    that do not pay for the replicas they take are dropped (:func:`plan_replicas`)."""
    table = pick_for(results, spec, provenance)
    if table.provenance.gpu_budget is not None:
        table = plan_replicas(table, results, spec.buckets, traffic)
    elif traffic is not None:
        table = no_worse_than_one_config(table, results, spec.buckets, traffic, spec.constraints)
    if any(b.cells for b in table.buckets):
        # A request without temperature is sampled at the engines' default; the router needs its band.
        backend = next(iter(table.distinct_configs().values())).backend
        table = table.model_copy(update={"default_temperature": API_DEFAULT_TEMPERATURE[backend]})
    return table


def pick_for(results: Any, spec: SweepSpec, provenance: Provenance) -> RoutingTable:
    """Each bucket's best config and its cells under ``spec``'s constraints (fitted to its serving budget
    when it has one): :func:`tuning.choose.pick.pick_best`, before :func:`choose_table`'s rules that weigh the
    table on the traffic mix (one config everywhere, the replica plan). The sweep's decide phase plans from
    this table (:func:`tuning.choose.decision.plan_decision`): those rules can replace a table whose
    undecided cell sits on the slower config by one config, whose table has no cell left to decide."""
    return pick_best(results, spec.buckets, spec.constraints, provenance=provenance, budget=spec.gpu_budget())


def no_worse_than_one_config(table: RoutingTable, results: Any, buckets: Sequence[Bucket], traffic: Any,
                             constraints: Any = None) -> RoutingTable:
    """``table``, or, where it is predicted on ``traffic`` below the best single config within
    ``constraints`` (or, running several configs, not more than :data:`~tuning.choose.cells.CELL_MIN_GAIN`
    above it), that config on every bucket with its own figures and no cells, and a note saying why: a
    table that needs more engines must pay for them on the user's mix, and it must never be worse than
    one config everywhere. The prediction splits the engines' time between the mix's parts at will (as
    with enough replicas per config); whole engines are the replica plan's business (``--serve-gpus``),
    and the summary shows the table on one engine per config beside it."""

    if constraints is not None and not results.empty:
        results = results[constraints.mask(results)]
    pred, where = predict_on_mix(table, results, buckets, traffic)
    if pred is None or pred.best_single is None:
        return table
    key, single = pred.best_single
    several = len(table.distinct_configs()) > 1
    if pred.per_bucket_throughput > single * (1 + (CELL_MIN_GAIN if several else 0.0)) or \
            set(table.distinct_configs()) == {key}:
        return table
    by_name = {b.name: b for b in buckets}
    routes = []
    for route in table.buckets:
        chosen = measured_at_primary(results, by_name[route.name], key)
        if chosen is None:
            return table  # the single config lacks a bucket's primary cell: keep the table as chosen
        config, figures = chosen
        routes.append(route.model_copy(update={"config": config, "figures": figures, "cells": (),
                                               "gains": gains_over(figures, route.baselines)}))
    note = (f"one config everywhere: on the traffic mix ({where}) the table as chosen predicts "
            f"{pred.per_bucket_throughput:,.0f} tok/s, {EngineConfig.from_dict(routes[0].config).label()} alone "
            f"{single:,.0f} ({pred.ratio:.2f}x; predicted from these figures, not measured)")
    kept = tuple(n for n in table.provenance.notes if n.startswith("noise:"))  # the others name replaced choices
    prov = table.provenance.model_copy(update={"notes": (*kept, note)})
    return table.model_copy(update={"buckets": tuple(routes), "provenance": prov})
