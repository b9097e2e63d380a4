"""Committing a chosen table: where it goes (:func:`table_targets`) and the one :func:`commit_table`.

Why apart from the choice: choosing is pure and testable on a results frame; committing is the one
step that writes, atomically and with history (:func:`orchestrator.table.commit`), so a failed choice
never touches a good table already in place.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from orchestrator import table as routing
from orchestrator.table import RoutingTable

__all__ = ["commit_table", "table_targets"]


def table_targets(spec: Any, extra: Iterable[str | Path] = ()) -> list[Path]:
    """Where the table goes: ``<run_dir>/routing_table.json`` first, then ``--routing-table`` and any
    other target, each once."""
    first = Path(spec.run_dir) / "routing_table.json"
    out = [first]
    for p in dict.fromkeys(Path(p) for p in [*([spec.routing_table] if spec.routing_table else []), *extra]):
        if p.resolve() != first.resolve():
            out.append(p)
    return out


def commit_table(table: RoutingTable, targets: str | Path | Sequence[str | Path]) -> RoutingTable:
    """Commit ``table`` atomically (:func:`orchestrator.table.commit`) to ``targets`` (one path, or several in
    order, as :func:`table_targets` lists them); returns the table as committed to the first (its version
    follows the table it replaces there)."""
    paths = [targets] if isinstance(targets, (str, Path)) else list(targets)
    if not paths:
        raise ValueError("no path to commit the routing table to")
    written = routing.commit(table, paths[0])
    for p in paths[1:]:
        routing.commit(table, p)
    return written
