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
from orchestrator.config import API_DEFAULT_TEMPERATURE
from orchestrator.table import Provenance, RoutingTable
from tuning.results import pick_best
from tuning.sweep.spec import SweepSpec

__all__ = ["choose_table", "commit_table", "table_targets"]


def choose_table(results: Any, spec: SweepSpec, provenance: Provenance) -> RoutingTable:
    """The routing table ``spec`` asks for from ``results`` (a results frame): each bucket's best
    config under the spec's constraints, fitted to its serving budget when it has one."""
    table = pick_best(results, spec.buckets, spec.constraints, provenance=provenance, budget=spec.gpu_budget())
    if any(b.cells for b in table.buckets):
        # A request without temperature is sampled at the engines' default; the router needs its band.
        backend = next(iter(table.distinct_configs().values())).backend
        table = table.model_copy(update={"default_temperature": API_DEFAULT_TEMPERATURE[backend]})
    return table


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
