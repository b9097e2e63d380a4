"""The cap: the best any routing table over a mix's parts could do with a set of configs on a fixed
number of replicas, found from each config's rate on each part measured alone. Pure: rates in, a plan
and a table out.

Why measured per part: a table is judged against the best table there could be, not against the
sweep's own estimate of it (which is what the table already is). Serving each part of the mix alone on
each candidate config, on the same engines and load as the comparison, gives per-part rates that do
not depend on the sweep; every routing of parts to configs is then sized on whole replicas
(:func:`tuning.choose.replicas.size_replicas`) and the fastest is the cap, to be served and measured beside
the table. A part is (bucket, sampling band): the cap does not split by load level, so a table whose
load cells pay can come out above it.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import product
from typing import Any

from tuning.choose.replicas import mix_rate, size_replicas, work_per_config

__all__ = ["MAX_ROUTINGS", "CapPlan", "best_routing", "cap_table", "pooled_rate"]

Part = tuple[str, str]
"""(bucket name, sampling band name)."""

#: Every routing of parts to configs is tried; beyond this many the search refuses (ask for fewer
#: candidates or coarser parts) instead of running for minutes.
MAX_ROUTINGS = 100_000


@dataclass(frozen=True)
class CapPlan:
    """Which config serves each part, whole replicas per config, and the mix's rate on them (output
    tok/s, tokens normalised to the shares)."""

    routes: Mapping[Part, str]
    replicas: Mapping[str, int]
    rate: float

    @property
    def single(self) -> str | None:
        """The one config when every part goes to the same one."""
        keys = set(self.routes.values())
        return next(iter(keys)) if len(keys) == 1 else None


def best_routing(rates: Mapping[tuple[str, str, str], float], shares: Mapping[Part, float],
                 replicas: int) -> CapPlan:
    """The routing of ``shares``' parts (share of the mix's output tokens each) to configs with the highest
    rate on at most ``replicas`` replicas in all. ``rates``: (engine key, bucket, band) -> output tok/s of
    one replica of that config serving that part alone. Ties go to fewer configs, then to the first
    routing in key order. Raises ``ValueError`` when a part has no rate or the search is too large."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    parts = sorted(p for p, s in shares.items() if s > 0)
    if not parts:
        raise ValueError("the mix has no output tokens")
    keys = sorted({k for k, *_ in rates})
    options = [[k for k in keys if rates.get((k, *p), 0) > 0] for p in parts]
    bare = [f"{b}/{band}" for (b, band), o in zip(parts, options) if not o]
    if bare:
        raise ValueError(f"no config has a rate on part(s) {bare}")
    count = 1
    for o in options:
        count *= len(o)
    if count > MAX_ROUTINGS:
        raise ValueError(f"{count} routings of {len(parts)} parts over {len(keys)} configs; at most {MAX_ROUTINGS}")
    best: CapPlan | None = None
    for choice in product(*options):
        routes = dict(zip(parts, choice))
        work = work_per_config(routes, shares, rates)
        sized = size_replicas(work, lambda r: sum(r.values()) <= replicas) if work else None
        if sized is None:
            continue
        rate = mix_rate(work, sized)
        if best is None or rate > best.rate * (1 + 1e-9) or (
                rate >= best.rate * (1 - 1e-9) and len(sized) < len(best.replicas)):
            best = CapPlan(routes=routes, replicas=sized, rate=rate)
    if best is None:
        raise ValueError(f"no routing fits {replicas} replica(s)")
    return best


def pooled_rate(rates: Mapping[tuple[str, str, str], float], shares: Mapping[Part, float], replicas: int) -> float:
    """The mix's rate if every part ran on its fastest config and the replicas' time could be split at will
    (``replicas`` / sum of share / fastest rate). No routing on whole replicas exceeds it; a router that
    moves requests between engines at run time (spilling at the batch limit) can come closer to it than any
    static routing, so it bounds such a table where :func:`best_routing` does not. Parts without a rate
    raise ``ValueError``."""
    total = 0.0
    for (bucket, band), share in shares.items():
        if share <= 0:
            continue
        best = max((r for (_, b, bd), r in rates.items() if (b, bd) == (bucket, band) and r > 0), default=None)
        if best is None:
            raise ValueError(f"no config has a rate on part {bucket}/{band}")
        total += share / best
    if total <= 0:
        raise ValueError("the mix has no output tokens")
    return replicas / total


def cap_table(table_data: Mapping[str, Any], plan: CapPlan, configs: Mapping[str, Mapping[str, Any]],
              rates: Mapping[tuple[str, str, str], float], *, primary_band: str) -> dict[str, Any]:
    """``table_data`` (its buckets and bands) routed as ``plan`` routes: each bucket's primary is the route
    of its ``primary_band`` part (else of its first part in the plan), and a cell from one request in flight
    for every other band routed elsewhere. Buckets the plan has no part of keep the plan's most-used config.
    ``configs``: engine key -> config; the figures are the per-part rates the plan was chosen from."""
    def figures(key: str, bucket: str, band: str) -> dict[str, Any]:
        return {"output_throughput": round(rates[(key, bucket, band)], 3)}

    counts = Counter(plan.routes.values())
    fallback = max(sorted(counts), key=lambda k: counts[k])
    buckets = []
    for b in table_data["buckets"]:
        mine = {band: key for (bucket, band), key in sorted(plan.routes.items()) if bucket == b["name"]}
        home = primary_band if primary_band in mine else next(iter(mine), None)
        primary = mine[home] if home else fallback
        cells = [{"sampling": band, "min_in_flight": 1, "config": dict(configs[key]), "figures": figures(key, b["name"], band)}
                 for band, key in mine.items() if key != primary]
        route = {"name": b["name"], "max_output_len": b["max_output_len"], "config": dict(configs[primary]),
                 "figures": figures(primary, b["name"], home) if home else {"output_throughput": 0.0}}
        buckets.append({**route, **({"cells": cells} if cells else {})})
    prov = {k: v for k, v in table_data["provenance"].items() if k != "gpu_budget"}
    out = {"schema_version": 2, "provenance": prov, "buckets": buckets}
    for k in ("default_max_tokens", "sampling_bands", "default_temperature"):
        if k in table_data:
            out[k] = table_data[k]
    return out
