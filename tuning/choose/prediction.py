"""A routing table against every single config on a traffic mix, predicted from the sweep's results:
with the engines' time split between the mix's parts at will (:func:`predict_on_mix`), or on whole
engines (:func:`predict_on_engines`).

Why: a table that needs more engines must pay for them on the user's mix; these predictions are what
the one-config rule (:func:`tuning.choose.table.no_worse_than_one_config`) and the summary read.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.table import RoutingTable
from tuning.buckets import Bucket
from tuning.choose.cells import BucketChoice, cell_measurements
from tuning.choose.mix import predict_mix
from tuning.choose.replicas import on_engines

__all__ = ["predict_on_engines", "predict_on_mix"]


def _mix_inputs(table: RoutingTable, results: Any, buckets: Sequence[Bucket], traffic: Any,
                constraints: Any) -> tuple[tuple[Any, Any, Any, Any], str] | tuple[None, str]:
    """What a prediction on ``traffic`` takes: ``((measurements, choices, token shares, load), where)``,
    or ``(None, why not)``."""

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
    :class:`tuning.traffic.TrafficMix`) within ``constraints`` (a :class:`tuning.choose.constraints.Constraints`),
    predicted from ``results`` over every load level measured (in equal token shares) or at the buckets'
    primary load (:func:`tuning.choose.mix.predict_mix`: the engines' time split between parts at will).
    Returns ``(prediction, where)``, or ``(None, why not)``."""

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
    as many (:func:`tuning.choose.replicas.on_engines`). Returns ``(prediction, where)``, or ``(None, why not)``."""

    inputs, where = _mix_inputs(table, results, buckets, traffic, constraints)
    if inputs is None:
        return None, where
    measured, choices, shares, load = inputs
    try:
        return on_engines(measured, choices, shares, in_flight=load,
                          replicas=replicas or {k: 1 for k in table.distinct_configs()}), where
    except ValueError as e:
        return None, str(e)
