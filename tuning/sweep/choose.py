"""Choosing the routing table: a decision made from the results frame alone, apart from committing it.

:func:`choose_table` is pure (results in, table out, nothing written); the sweep's runner commits the
decision (:func:`commit_table`) to the run dir first and then to every other target. An incomplete
sweep raises :class:`~tuning.results.IncompleteResultsError` from the choice, before anything is
written, so a good table already at a target stays.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from orchestrator import table as routing
from orchestrator.config import API_DEFAULT_TEMPERATURE, EngineConfig
from orchestrator.table import Provenance, RoutingTable
from tuning.buckets import Bucket
from tuning.results import CELL_DROPPED, CELL_MIN_GAIN, gains_over, pick_best
from tuning.sweep.spec import SweepSpec

__all__ = ["choose_table", "commit_table", "no_worse_than_one_config", "pick_for", "plan_replicas", "predict_on_engines",
           "predict_on_mix", "table_targets"]


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
    when it has one): :func:`tuning.results.pick_best`, before :func:`choose_table`'s rules that weigh the
    table on the traffic mix (one config everywhere, the replica plan). The sweep's decide phase plans from
    this table (:func:`tuning.sweep.decide.plan_decision`): those rules can replace a table whose
    undecided cell sits on the slower config by one config, whose table has no cell left to decide."""
    return pick_best(results, spec.buckets, spec.constraints, provenance=provenance, budget=spec.gpu_budget())


def plan_replicas(table: RoutingTable, results: Any, buckets: Sequence[Bucket], traffic: Any = None) -> RoutingTable:
    """``table`` on its budget's GPUs as :func:`tuning.replicas.plan_serving` plans it: cells and bucket
    primaries that do not pay for the replicas they take handed to configs it keeps, replicas per engine
    in ``provenance.gpu_budget.replicas``, what changed and the predicted mix in its notes. A table with
    load variants, or one whose mix the results do not cover, is returned with one replica each and a
    note saying why."""
    from tuning.cells import BucketChoice
    from tuning.mixed import bucket_tokens
    from tuning.replicas import plan_serving
    from tuning.results import cell_measurements

    budget = table.provenance.gpu_budget
    assert budget is not None

    def noted(*notes: str, replicas: dict[str, int] | None = None, buckets: Any = None) -> RoutingTable:
        # A plan re-decides every part of the mix, so the fitting step's dropped cells are moot then.
        kept = budget.notes if buckets is None else tuple(n for n in budget.notes if not n.endswith(CELL_DROPPED))
        new_budget = budget.model_copy(update={"notes": (*kept, *notes), "replicas": replicas or {}})
        return table.model_copy(update={"provenance": table.provenance.model_copy(update={"gpu_budget": new_budget}),
                                        **({"buckets": buckets} if buckets is not None else {})})

    if any(b.load_variants for b in table.buckets):
        return noted("replicas not planned: the table has load variants (one replica each)")
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
    try:
        plan = plan_serving(measured, choices, shares, in_flight={level: 1.0 for level in levels},
                            primary_band=primary_band.name if primary_band else "greedy", fits=fits,
                            min_gain=CELL_MIN_GAIN, labels={k: c.label() for k, c in configs.items()})
    except ValueError as e:
        return noted(f"replicas not planned: {e} (one replica each)")
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
    return noted(summary, *plan.notes, replicas=dict(plan.replicas), buckets=tuple(buckets))


def _mix_inputs(table: RoutingTable, results: Any, buckets: Sequence[Bucket], traffic: Any,
                constraints: Any) -> tuple[tuple[Any, Any, Any, Any], str] | tuple[None, str]:
    """What a prediction on ``traffic`` takes: ``((measurements, choices, token shares, load), where)``,
    or ``(None, why not)``."""
    from tuning.cells import BucketChoice
    from tuning.results import cell_measurements

    if constraints is not None and not results.empty:
        results = results[constraints.mask(results)]
    measured = [m for b in buckets for m in cell_measurements(results, b)]
    choices = {b.name: BucketChoice.of_route(b) for b in table.buckets}
    primaries = {b.primary_concurrency for b in buckets}
    levels = sorted({m.in_flight for m in measured})
    shares = traffic.cell_shares(table, by="tokens")
    missing = sorted({band for _, band in shares} - {m.band for m in measured})
    if missing:
        return None, f"the sweep measured no {', '.join(missing)} traffic (add --temperatures, e.g. 0,0.8)"
    if len(levels) < 2 and len(primaries) != 1:
        return None, "the buckets' primary loads differ"
    if len(levels) > 1:
        return (measured, choices, shares, {level: 1.0 for level in levels}), \
            f"over load levels {'/'.join(map(str, levels))} in equal token shares"
    load = primaries.pop()
    return (measured, choices, shares, load), f"at {load} in flight"


def predict_on_mix(table: RoutingTable, results: Any, buckets: Sequence[Bucket], traffic: Any,
                   constraints: Any = None) -> tuple[Any, str]:
    """``table`` and every single config measured on every part of ``traffic`` (a
    :class:`tuning.traffic.TrafficMix`) within ``constraints`` (a :class:`tuning.results.Constraints`),
    predicted from ``results`` over every load level measured (in equal token shares) or at the buckets'
    primary load (:func:`tuning.cells.predict_mix`: the engines' time split between parts at will; a
    bucket's load variants are not modelled). Returns ``(prediction, where)``, or ``(None, why not)``."""
    from tuning.cells import predict_mix

    inputs, where = _mix_inputs(table, results, buckets, traffic, constraints)
    if inputs is None:
        return None, where
    measured, choices, shares, load = inputs
    try:
        return predict_mix(measured, choices, shares, in_flight=load), where
    except ValueError as e:
        return None, str(e)


def predict_on_engines(table: RoutingTable, results: Any, buckets: Sequence[Bucket], traffic: Any,
                       replicas: dict[str, int] | None = None, constraints: Any = None) -> tuple[Any, str]:
    """As :func:`predict_on_mix`, with the table on whole engines — ``replicas`` (engine key -> engines),
    by default one per config, how a table without a serving plan deploys — and each single config on
    as many (:func:`tuning.replicas.on_engines`). Returns ``(prediction, where)``, or ``(None, why not)``."""
    from tuning.replicas import on_engines

    inputs, where = _mix_inputs(table, results, buckets, traffic, constraints)
    if inputs is None:
        return None, where
    measured, choices, shares, load = inputs
    try:
        return on_engines(measured, choices, shares, in_flight=load,
                          replicas=replicas or {k: 1 for k in table.distinct_configs()}), where
    except ValueError as e:
        return None, str(e)


def no_worse_than_one_config(table: RoutingTable, results: Any, buckets: Sequence[Bucket], traffic: Any,
                             constraints: Any = None) -> RoutingTable:
    """``table``, or, where it is predicted on ``traffic`` below the best single config within
    ``constraints`` (or, running several configs, not more than :data:`~tuning.results.CELL_MIN_GAIN`
    above it), that config on every bucket with its own figures and no cells, and a note saying why: a
    table that needs more engines must pay for them on the user's mix, and it must never be worse than
    one config everywhere. The prediction splits the engines' time between the mix's parts at will (as
    with enough replicas per config); whole engines are the replica plan's business (``--serve-gpus``),
    and the summary shows the table on one engine per config beside it. A table with load variants is
    returned as it is (the prediction does not model them)."""
    from tuning.results import measured_at_primary

    if any(b.load_variants for b in table.buckets):
        return table
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


def table_targets(spec: SweepSpec, extra: Iterable[str | Path] = ()) -> list[Path]:
    """Where the table goes: ``<run_dir>/routing_table.json`` first, then ``--routing-table`` and any
    other target, each once."""
    first = Path(spec.run_dir) / "routing_table.json"
    out = [first]
    for p in dict.fromkeys(Path(p) for p in [*([spec.routing_table] if spec.routing_table else []), *extra]):
        if p.resolve() != first.resolve():
            out.append(p)
    return out


def commit_table(table: RoutingTable, targets: Sequence[Path]) -> RoutingTable:
    """Commit ``table`` to every target in order (atomically each); returns the table as committed to
    the first (its version follows the table it replaces there)."""
    written = routing.commit(table, targets[0])
    for p in targets[1:]:
        routing.commit(table, p)
    return written
