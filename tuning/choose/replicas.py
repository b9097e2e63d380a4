"""Whole replicas per config on a fixed pool of GPUs, and which of a table's configs pay for the
GPUs they take. Pure: measurements and a mix in, a plan out.

Why: a routing table with k distinct configs runs at least k engines. The mix prediction
(:func:`tuning.choose.mix.predict_mix`) gives every part of the traffic engines in proportion to its work,
as if GPUs could be split at will; on a fixed pool (``--serve-gpus``) replicas are whole, and the
config with the most work per replica holds the whole table back. A cell that is faster on its own
part can still lose overall when it takes a replica the rest of the traffic needed more, so the plan
keeps a cell, or a bucket's own primary, only while the mix on whole replicas says it pays, and falls
back to one config on every GPU when that is as good.

The model: a part of the mix (bucket x sampling band x load level) with a share ``t`` of the output
tokens, served by a config whose replica makes ``r`` tok/s there, costs ``t / r`` replica-seconds per
token of the mix; a config with work ``w`` on ``n`` replicas finishes its parts in ``w / n``; the mix
runs at ``1 / max(w / n)`` tok/s. Like the prediction it refines, it takes each replica's rate at the
load it was measured at, whatever the number of replicas sharing the traffic.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import combinations

from orchestrator.table import Cell
from tuning.choose.cells import BucketChoice, CellMeasurement
from tuning.choose.mix import mix_parts, part_rates

__all__ = ["MAX_CONFIGS", "MAX_REPLICAS", "EnginesPrediction", "ServingPlan", "choices_from_routes", "mix_rate", "on_engines",
           "plan_serving", "size_replicas", "work_per_config"]

Part = tuple[str, str, int]
"""(bucket, sampling band, load level)."""


@dataclass(frozen=True)
class ServingPlan:
    """What to serve on the pool: each bucket's primary and the cells kept, whole replicas per engine
    key, the mix's predicted output tok/s on them, and the best single config on the whole pool."""

    choices: Mapping[str, BucketChoice]
    replicas: Mapping[str, int]
    throughput: float
    single: tuple[str, float] | None
    notes: tuple[str, ...] = ()

    @property
    def ratio(self) -> float | None:
        """The plan over the best single config on the same GPUs (``None`` without a single candidate)."""
        return self.throughput / self.single[1] if self.single else None


def work_per_config(routes: Mapping[Part, str], tokens: Mapping[Part, float],
                    rates: Mapping[tuple[str, str, str, int], float]) -> dict[str, float] | None:
    """Replica-seconds per token of the mix each engine key serves (``None`` when a part's config was
    not measured there)."""
    work: dict[str, float] = {}
    for part, key in routes.items():
        r = rates.get((key, *part))
        if not r:
            return None
        work[key] = work.get(key, 0.0) + tokens[part] / r
    return work


#: A plan serves at most this many distinct configs (the search tries every set of the candidates up
#: to this size; each config is at least one engine, and a table rarely pays for more).
MAX_CONFIGS = 4

#: No plan runs more replicas than this in all (Serve's own cap on a deployment is 1024).
MAX_REPLICAS = 1024


def size_replicas(work: Mapping[str, float], fits: Callable[[Mapping[str, int]], bool]) -> dict[str, int] | None:
    """Whole replicas per key: one each, then one more to the key with the most work per replica for as
    long as that fits (``fits(replicas)``) and the total stays within :data:`MAX_REPLICAS`. Giving the
    next replica to the bottleneck is what maximises the smallest ``n / w``; once the bottleneck's next
    replica does not fit, no other one helps. ``None`` when one replica each does not fit."""
    replicas = {k: 1 for k in work}
    if not fits(replicas):
        return None
    while sum(replicas.values()) < MAX_REPLICAS:
        key = max(work, key=lambda k: (work[k] / replicas[k], k))
        grown = {**replicas, key: replicas[key] + 1}
        if not fits(grown):
            break
        replicas = grown
    return replicas


def mix_rate(work: Mapping[str, float], replicas: Mapping[str, int]) -> float:
    """Output tok/s of the mix with ``replicas`` per key (tokens normalised to one)."""
    return 1.0 / max(w / replicas[k] for k, w in work.items())


@dataclass(frozen=True)
class EnginesPrediction:
    """The table as chosen on given whole engines, and the best single config on as many."""

    replicas: Mapping[str, int]
    throughput: float
    single: tuple[str, float] | None

    @property
    def engines(self) -> int:
        return sum(self.replicas.values())

    @property
    def ratio(self) -> float | None:
        return self.throughput / self.single[1] if self.single else None


def on_engines(measurements: Sequence[CellMeasurement], choices: Mapping[str, BucketChoice],
               token_shares: Mapping[tuple[str, str], float], *, in_flight: int | Mapping[int, float],
               replicas: Mapping[str, int]) -> EnginesPrediction:
    """The mix's rate (as :func:`tuning.choose.mix.predict_mix` takes it) with the table ``choices`` served
    by ``replicas`` (engine key -> whole engines; a config the mix does not reach idles on its own), and
    with the best single config measured on every part on as many engines. Unlike
    :func:`~tuning.choose.mix.predict_mix`, whose parts have engines in proportion to their work, each config
    here has the engines it is given: with few of them one config may carry most of the mix while
    another idles, which can cost a table more than its routing gains. Raises ``ValueError`` when the
    table's configs were not measured on a part of the mix or one of them has no engine."""
    shares = mix_parts(token_shares, in_flight)
    rates = part_rates(measurements)
    own = {p: choices[p[0]].key_for(p[1], p[2]) for p in shares if p[0] in choices}
    work = work_per_config(own, shares, rates) if len(own) == len(shares) else None
    if work is None:
        raise ValueError("the table's configs were not all measured on the mix's parts")
    unserved = sorted(k for k in work if replicas.get(k, 0) < 1)
    if unserved:
        raise ValueError(f"no engine for {', '.join(unserved)}")
    engines = sum(replicas.values())
    single = None
    for key in sorted({k for k, *_ in rates}):
        w = work_per_config({p: key for p in shares}, shares, rates)
        if w is not None and (single is None or engines / w[key] > single[1]):
            single = (key, engines / w[key])
    return EnginesPrediction(replicas=dict(replicas), throughput=mix_rate(work, replicas), single=single)


def plan_serving(measurements: Sequence[CellMeasurement], choices: Mapping[str, BucketChoice],
                 token_shares: Mapping[tuple[str, str], float], *, in_flight: int | Mapping[int, float],
                 primary_band: str, fits: Callable[[Mapping[str, int]], bool], min_gain: float = 0.0,
                 labels: Mapping[str, str] | None = None) -> ServingPlan:
    """The plan for the table ``choices`` (each bucket's primary and cells) on the pool ``fits``
    describes, for the mix ``token_shares`` x ``in_flight`` (as :func:`tuning.choose.mix.predict_mix` takes them).

    Candidates are the table's configs and every config measured on every part of the mix. For each set
    of at most :data:`MAX_CONFIGS` of them, every part goes to the set's fastest config there, or to the
    table's own choice when the set has it and the fastest does not beat it by more than ``min_gain``
    (the table chose beyond noise); replicas are sized on the pool. The set with the highest rate on
    whole replicas wins (fewer configs at equal rates; the table as chosen when no set beats it), and
    several configs are kept only when they beat the best single config on the whole pool by more than
    ``min_gain``. The winner is written back as each bucket's primary (its route on the primary cell)
    and cells where the route differs. ``primary_band``: the band the primaries were measured on;
    ``labels`` name engine keys in the notes. Raises ``ValueError`` when the table's configs were not
    measured on a part of the mix or one replica of each does not fit."""
    shares = mix_parts(token_shares, in_flight)
    rates = part_rates(measurements)
    labels = dict(labels or {})

    def name(key: str) -> str:
        return labels.get(key, key)

    missing = sorted({b for b, _, _ in shares} - set(choices))
    if missing:
        raise ValueError(f"no choice for bucket(s) of the mix: {missing}")
    own = {p: choices[p[0]].key_for(p[1], p[2]) for p in shares}
    work = work_per_config(own, shares, rates)
    if work is None:
        unmeasured = sorted(f"{key} on {b}/{band}@{level}" for (b, band, level), key in own.items()
                            if not rates.get((key, b, band, level)))
        raise ValueError(f"the table's configs were not all measured on the mix's parts: {', '.join(unmeasured)}")
    own_replicas = size_replicas(work, fits)
    if own_replicas is None:
        raise ValueError(f"one replica of each of the table's {len(work)} configs does not fit the GPUs")
    own_rate = mix_rate(work, own_replicas)
    table_keys = set(own.values())
    everywhere = {k for k, *_ in rates if all(rates.get((k, *p)) for p in shares)}
    candidates = sorted(table_keys | everywhere)

    def route(keys: frozenset[str]) -> dict[Part, str] | None:
        out = {}
        for p, mine in own.items():
            here = [k for k in keys if rates.get((k, *p))]
            if not here:
                return None
            best = max(here, key=lambda k: (rates[(k, *p)], k))
            kept = mine in keys and rates[(mine, *p)] * (1 + min_gain) >= rates[(best, *p)]
            out[p] = mine if kept else best
        return out

    best = (own_rate, len(work), own, own_replicas)  # the table as chosen: the search only improves on it
    single: tuple[str, float] | None = None
    for n in range(1, min(MAX_CONFIGS, len(candidates)) + 1):
        for keys in combinations(candidates, n):
            routes = route(frozenset(keys))
            w = work_per_config(routes, shares, rates) if routes is not None else None
            if w is None or len(w) < n:  # a config no part goes to is the smaller set's plan
                continue
            replicas = size_replicas(w, fits)
            if replicas is None:
                continue
            r = mix_rate(w, replicas)
            if n == 1 and (single is None or r > single[1]):
                single = (keys[0], r)
            if r > best[0] * (1 + 1e-9) or (r >= best[0] * (1 - 1e-9) and n < best[1]):
                best = (r, n, routes, replicas)
    rate, _, routes, replicas = best
    notes = []
    if single is not None and len(replicas) > 1 and rate <= single[1] * (1 + min_gain):
        key = single[0]
        notes.append(f"one config everywhere: {name(key)} makes {single[1]:,.0f} tok/s on the mix, the best "
                     f"set of several {rate:,.0f} (not more than {min_gain:.0%} better)")
        routes = {p: key for p in shares}
        replicas = size_replicas(work_per_config(routes, shares, rates), fits)
        rate = single[1]
    planned = choices_from_routes(routes, measurements, choices, primary_band)
    if set(replicas) != set(own_replicas) or planned != dict(choices):
        dropped = sorted(table_keys - set(replicas))
        notes.insert(0, f"as chosen per replica the table would make {own_rate:,.0f} tok/s on whole replicas, the "
                        f"plan makes {rate:,.0f}"
                        + (f" without {', '.join(name(k) for k in dropped)}" if dropped else ""))
    return ServingPlan(choices=planned, replicas=replicas, throughput=rate, single=single, notes=tuple(notes))


def choices_from_routes(routes: Mapping[Part, str], measurements: Sequence[CellMeasurement],
                         choices: Mapping[str, BucketChoice], primary_band: str) -> dict[str, BucketChoice]:
    """Each bucket as ``routes`` serve it: the primary is the route on the bucket's primary cell (the
    table's primary when the mix has no tokens there), and a cell wherever another (band, level) of the
    mix goes elsewhere; unchanged buckets are returned as they were."""
    by_key = {(m.engine_key, m.bucket, m.band, m.in_flight): m for m in measurements}
    out = {}
    for b, c in choices.items():
        mine = {(band, level): key for (bucket, band, level), key in routes.items() if bucket == b}
        home = (primary_band, c.primary_figures.concurrency)
        primary_key = mine.get(home, c.primary_key)
        if all(key == c.key_for(band, level) for (band, level), key in mine.items()) and primary_key == c.primary_key:
            out[b] = c
            continue
        m = by_key.get((primary_key, b, *home))
        chosen = replace(c, primary_key=primary_key, cells=(),
                         primary_config=m.config if m else c.primary_config,
                         primary_figures=m.figures() if m else c.primary_figures)
        lowest = min([level for _, level in mine] + [home[1]])
        for (band, level), key in sorted(mine.items()):
            if key == chosen.key_for(band, level):
                continue
            cm, pm = by_key[(key, b, band, level)], by_key.get((primary_key, b, band, level))
            chosen = replace(chosen, cells=(*chosen.cells, Cell(
                sampling=band, min_in_flight=1 if level == lowest else level, config=dict(cm.config),
                figures=cm.figures(), primary_figures=pm.figures() if pm else None)))
        out[b] = chosen
    return out
