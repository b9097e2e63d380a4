"""Whole replicas per config on a fixed pool of GPUs, and which of a table's configs pay for the
GPUs they take. Pure: measurements and a mix in, a plan out.

Why: a routing table with k distinct configs runs at least k engines. The mix prediction
(:func:`tuning.cells.predict_mix`) gives every part of the traffic engines in proportion to its work,
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

from tuning.cells import BucketChoice, CellMeasurement, mix_parts, part_rates

__all__ = ["MAX_REPLICAS", "ServingPlan", "mix_rate", "plan_serving", "size_replicas", "work_per_config"]

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


def plan_serving(measurements: Sequence[CellMeasurement], choices: Mapping[str, BucketChoice],
                 token_shares: Mapping[tuple[str, str], float], *, in_flight: int | Mapping[int, float],
                 primary_band: str, fits: Callable[[Mapping[str, int]], bool], min_gain: float = 0.0,
                 labels: Mapping[str, str] | None = None) -> ServingPlan:
    """The plan for ``choices`` (each bucket's primary and cells) on the pool ``fits`` describes, for the
    mix ``token_shares`` x ``in_flight`` (as :func:`tuning.cells.predict_mix` takes them).

    Starting from the table as chosen, it takes the best of these changes while one raises the mix's
    rate on whole replicas (or keeps it with one engine fewer): drop a cell, or give a bucket's primary
    traffic to another config the table already runs. Then every config measured on every part of the
    mix, alone on the whole pool: the plan keeps several configs only when they beat the best of those
    by more than ``min_gain``. ``primary_band``: the band the buckets' primaries were measured on (their
    figures come from there). ``labels`` name engine keys in the notes. Raises ``ValueError`` when the
    table's configs were not measured on a part of the mix or one replica each does not fit."""
    shares = mix_parts(token_shares, in_flight)
    rates = part_rates(measurements)
    name = dict(labels or {}).get

    def evaluate(cs: Mapping[str, BucketChoice]) -> tuple[float, dict[str, int]] | None:
        work = work_per_config({p: cs[p[0]].key_for(p[1], p[2]) for p in shares}, shares, rates)
        if work is None:
            return None
        replicas = size_replicas(work, fits)
        return None if replicas is None else (mix_rate(work, replicas), replicas)

    missing = sorted({b for b, _, _ in shares} - set(choices))
    if missing:
        raise ValueError(f"no choice for bucket(s) of the mix: {missing}")
    current = dict(choices)
    got = evaluate(current)
    if got is None:
        raise ValueError("the table's configs were not all measured on the mix's parts, or one replica of each "
                         "does not fit the GPUs")
    rate, replicas = got
    notes: list[str] = []
    while True:
        best: tuple[float, int, dict[str, BucketChoice], dict[str, int], str] | None = None
        for cs, why in _moves(current, measurements, primary_band, name):
            got = evaluate(cs)
            if got is None:
                continue
            r, reps = got
            better = r > rate * (1 + 1e-9) or (r >= rate * (1 - 1e-9) and len(reps) < len(replicas))
            if better and (best is None or (r, -len(reps)) > (best[0], -best[1])):
                best = (r, len(reps), cs, reps, why)
        if best is None:
            break
        rate, _, current, replicas, why = best
        notes.append(f"{why}: the mix on whole replicas {rate:,.0f} tok/s")
    singles = []
    for key in sorted({k for k, *_ in rates}):
        work = work_per_config({p: key for p in shares}, shares, rates)
        reps = size_replicas(work, fits) if work is not None else None
        if reps is not None:
            singles.append((key, mix_rate(work, reps), reps))
    single = max(singles, key=lambda s: s[1], default=None)
    # several configs must beat one by more than min_gain; one config must simply be beaten
    if single is not None and set(replicas) != {single[0]} and (
            single[1] * (1 + min_gain) >= rate if len(replicas) > 1 else single[1] > rate):
        key, r, reps = single
        config = next(m.config for m in measurements if m.engine_key == key)
        figures = {b: _figures_of(measurements, key, c, primary_band) for b, c in current.items()}
        if all(figures.values()):
            current = {b: replace(c, primary_key=key, primary_config=config, cells=(), primary_figures=figures[b])
                       for b, c in current.items()}
            notes.append(f"one config everywhere: {name(key) or key} on {reps[key]} replica(s) makes {r:,.0f} tok/s "
                         f"on the mix, the table's {len(replicas)} configs {rate:,.0f} (not more than {min_gain:.0%} "
                         "better)")
            rate, replicas = r, reps
    return ServingPlan(choices=current, replicas=replicas, throughput=rate,
                       single=(single[0], single[1]) if single else None, notes=tuple(notes))


def _moves(choices: Mapping[str, BucketChoice], measurements: Sequence[CellMeasurement], primary_band: str,
           name: Callable[[str], str | None]):
    """Every table one step simpler than ``choices``: one cell dropped, or one bucket's primary handed to
    another config the table runs; with why, for the notes."""
    used = {c.primary_key: c.primary_config for c in choices.values()}
    used.update({cell.engine_config().key(): cell.config for c in choices.values() for cell in c.cells})
    for b, c in choices.items():
        for i, cell in enumerate(c.cells):
            kept = replace(c, cells=c.cells[:i] + c.cells[i + 1:])
            yield ({**choices, b: kept},
                   f"{b} cell {cell.sampling or 'any'}@{cell.min_in_flight} "
                   f"({name(cell.engine_config().key()) or cell.engine_config().key()}) dropped")
        for key, config in used.items():
            if key == c.primary_key:
                continue
            figures = _figures_of(measurements, key, c, primary_band)
            if figures is None:
                continue
            cells = tuple(cell for cell in c.cells if cell.engine_config().key() != key)  # now the primary's own
            yield ({**choices, b: replace(c, primary_key=key, primary_config=config, primary_figures=figures, cells=cells)},
                   f"{b} primary {name(c.primary_key) or c.primary_key} -> {name(key) or key}")


def _figures_of(measurements: Sequence[CellMeasurement], key: str, choice: BucketChoice, band: str):
    """``key``'s figures where ``choice``'s primary was measured (``band`` at its figures' load)."""
    for m in measurements:
        if (m.engine_key, m.bucket, m.band, m.in_flight) == (key, choice.bucket, band, choice.primary_figures.concurrency):
            return m.figures()
    return None
