"""What the sweep left undecided and would measure again (``--decide-rounds R``): the pure plan of the
decide phase (:func:`plan_decision`); :mod:`tuning.sweep.decide` runs it on the Ray cluster.

A cell comparison within noise keeps the bucket's config: "not shown", not "the same". Where the true
gap is real but the rounds were too few to show it, a second sweep of the same space can show it and
commit another route. The plan names each such comparison, both configs as trial params, and the buckets
cut down to the undecided cells' temperatures and loads.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator import table as routing
from orchestrator.table import RoutingTable
from tuning.buckets import Bucket
from tuning.choose.cells import Undecided, undecided_cells
from tuning.choose.constraints import NO_CONSTRAINTS, Constraints
from tuning.results import STATUS_OK, config_of_row

__all__ = ["ROLE_DECIDE", "DecisionPlan", "plan_decision"]


ROLE_DECIDE = "decide"


@dataclass(frozen=True)
class DecisionPlan:
    """What to measure again: the undecided comparisons, each involved config once (engine key ->
    trial params), and the buckets cut down to the undecided cells' temperatures and loads; ``rounds``
    per config in all, split evenly over ``starts`` fresh engines per config."""

    undecided: tuple[Undecided, ...]
    points: Mapping[str, Mapping[str, Any]]
    buckets: tuple[Bucket, ...]
    rounds: int
    starts: int = 1

    def __post_init__(self) -> None:
        _check_starts(self.rounds, self.starts)

    @property
    def rounds_per_start(self) -> int:
        return self.rounds // self.starts

    def describe(self) -> str:
        cells = ", ".join(f"{u.bucket} {u.band}@{u.in_flight}" for u in self.undecided)
        head = f"{len(self.undecided)} cell comparison(s) within noise ({cells}): {len(self.points)} config(s) "
        if self.starts == 1:
            return head + f"to measure again on a fresh engine each, {self.rounds} rounds per cell"
        return head + (f"to measure again on {self.starts} fresh engines each, {self.rounds_per_start} "
                       f"round{'s' if self.rounds_per_start != 1 else ''} per cell on each")


def _check_starts(rounds: int, starts: int) -> None:
    if not isinstance(starts, int) or isinstance(starts, bool) or starts < 1:
        raise ValueError(f"starts={starts!r}; allowed: a whole number >= 1")
    if rounds % starts:
        raise ValueError(f"rounds={rounds} does not split evenly over starts={starts}: use a multiple of {starts}")


def plan_decision(results: Any, buckets: Sequence[Bucket], table: RoutingTable, rounds: int,
                  constraints: Constraints = NO_CONSTRAINTS, *, starts: int = 1,
                  exclude: Collection[tuple[str, str, int]] = ()) -> DecisionPlan | None:
    """The re-measurement the undecided cells of ``table`` (chosen from ``results``) ask for, or ``None``
    when there is none (or ``rounds`` is 0); ``rounds`` per config split over ``starts`` fresh engines per
    config (``rounds`` must be a multiple of ``starts``). The sweep passes the table as
    :func:`tuning.choose.table.pick_for` chooses it, before the rules on the traffic mix: a table that kept
    an undecided cell on the slower config predicts less on the mix, the one-config rule can then commit
    one config everywhere, and that table has no cell left to decide, so the comparison that tipped it
    would never be measured again. A cell whose kept config and another already have decide rows there
    (an earlier decide phase of a resumed sweep) is not measured a third time, whichever config it is now
    compared with: a resume that only commits must not start engines again. ``exclude``: (bucket, band,
    load) cells not to plan (those an earlier pass of this phase planned, whatever it measured)."""
    if rounds < 0:
        raise ValueError(f"rounds={rounds}; allowed: >= 0")
    _check_starts(rounds, starts)
    if rounds == 0:
        return None
    ok = results[results["status"] == STATUS_OK]
    again: dict[tuple[str, str, int], set[str]] = {}
    for r in (ok[ok["role"] == ROLE_DECIDE].to_dict("records") if "role" in ok else ()):
        again.setdefault((r["bucket"], r["sampling_band"], int(r["concurrency"])), set()).add(r["engine_key"])

    def measured_again(u: Undecided) -> bool:
        """The kept config and another were measured again on ``u``'s cell: pooling can make a third config
        the runner-up there, and that comparison is not worth engine starts of its own."""
        keys = again.get((u.bucket, u.band, u.in_flight), set())
        return u.kept_key in keys and len(keys) > 1

    undecided = [u for u in undecided_cells(results, buckets, table, constraints)
                 if not measured_again(u) and (u.bucket, u.band, u.in_flight) not in exclude]
    if not undecided:
        return None
    points: dict[str, dict[str, Any]] = {}
    for key in dict.fromkeys(k for u in undecided for k in (u.other_key, u.kept_key)):
        rows = ok[ok["engine_key"] == key]
        if not rows.empty:
            points[key] = _params(rows.iloc[0].to_dict())
    undecided = [u for u in undecided if u.other_key in points and u.kept_key in points]
    if not undecided:
        return None
    by_name = {b.name: b for b in buckets}
    cut: list[Bucket] = []
    for name in dict.fromkeys(u.bucket for u in undecided):
        b = by_name[name]
        mine = [u for u in undecided if u.bucket == name]
        bands = {u.band for u in mine}
        temps = tuple(t for t in b.temperatures if (band := routing.band_of(t)) is not None and band.name in bands)
        levels = tuple(sorted({u.in_flight for u in mine}))
        cut.append(dataclasses.replace(b, workload=b.workload_at(levels[0], temps[0]), concurrency_levels=levels,
                                       temperatures=temps))
    return DecisionPlan(tuple(undecided), points, tuple(cut), rounds, starts)


def _params(row: Mapping[str, Any]) -> dict[str, Any]:
    """A results row's config as trial params (what the search space turns back into the same engine)."""
    cfg = config_of_row(row)
    params: dict[str, Any] = {"speculative": cfg["speculative_algorithm"] is not None,
                              "memory_fraction": cfg["memory_fraction"]}
    if params["speculative"]:
        params["num_draft_tokens"] = cfg["num_draft_tokens"]
    elif (backend := cfg.get("simulated_backend") or cfg["backend"]) != "sim":  # what a simulated engine stands in for
        params["backend"] = backend
    if cfg.get("max_batch_size") is not None:
        params["max_batch_size"] = cfg["max_batch_size"]
    params["extra_flags"] = list(cfg.get("extra_flags") or ())  # all of them: run_decision takes off the space's
    return params
