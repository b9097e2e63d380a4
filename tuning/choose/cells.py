"""Choosing a bucket's cells (sampling band x load level) that get a config of their own, from the
sweep's measurements on every cell. Pure: measurements in, decisions out.

Why cells only beyond noise: every extra config is one more engine to run, and on real GPUs one
benchmark wave moves 12-17 %. A cell gets its own config only when that config's confidence interval
over interleaved rounds lies entirely above the interval of the config the cell would otherwise use;
everything else shares the primary's engines.
"""
from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from orchestrator import table as routing
from orchestrator.config import EngineConfig
from orchestrator.table import (
    BucketFigures,
    BucketRoute,
    Cell,
    RoutingTable,
    select_cell,
)
from tuning.buckets import Bucket
from tuning.choose.constraints import NO_CONSTRAINTS, Constraints
from tuning.choose.noise import pooled_noise
from tuning.results import STATUS_OK, config_of_row, is_cached_copy, repeat_throughputs
from tuning.stats import PooledNoise, effective_starts, mean_confidence_interval

__all__ = ["CELL_MIN_GAIN", "BucketChoice", "CellMeasurement", "Undecided", "bucket_cells", "cell_measurements",
           "choose_cells", "undecided_cells"]


#: A cell's config must beat the one it replaces by more than this (the noise floor of figures measured
#: once, whose confidence intervals have no width); the replica plan holds several configs to it too.
CELL_MIN_GAIN = 0.03


@dataclass(frozen=True)
class CellMeasurement:
    """One config measured on one cell of one bucket: a throughput per interleaved round, and how many of
    those rounds each engine start measured (``rounds_per_start``, in the order of ``throughputs``; empty:
    one start measured them all)."""

    config: Mapping[str, Any]
    bucket: str
    band: str
    in_flight: int
    throughputs: tuple[float, ...]
    accept_length: float | None = None
    rounds_per_start: tuple[int, ...] = ()

    @property
    def engine_key(self) -> str:
        return EngineConfig.from_dict(self.config).key()

    @property
    def starts(self) -> float:
        """The engine starts the mean averages (:func:`tuning.stats.effective_starts`)."""
        return effective_starts(self.rounds_per_start or (len(self.throughputs),))

    def __post_init__(self) -> None:
        if not self.throughputs or any(t < 0 for t in self.throughputs):
            raise ValueError(f"{self.engine_key} on {self.bucket}/{self.band}@{self.in_flight}: "
                             f"throughputs must be >= 0 and at least one, got {self.throughputs}")
        if self.rounds_per_start and (sum(self.rounds_per_start) != len(self.throughputs)
                                      or min(self.rounds_per_start) < 1):
            raise ValueError(f"{self.engine_key} on {self.bucket}/{self.band}@{self.in_flight}: rounds_per_start "
                             f"{self.rounds_per_start} must be >= 1 each and add up to the "
                             f"{len(self.throughputs)} throughputs")

    def figures(self, level: float = 0.95) -> BucketFigures:
        mean, low, high = mean_confidence_interval(self.throughputs, level)
        return BucketFigures(output_throughput=mean, output_throughput_ci=(max(low, 0.0), high),
                             rounds=len(self.throughputs), accept_length=self.accept_length,
                             concurrency=self.in_flight)


@dataclass(frozen=True)
class Undecided:
    """A cell comparison not shown either way at the pooled noise: ``kept_key`` serves the (``band``,
    ``in_flight``) part of the bucket, and ``other_key`` is the config it was compared with there, the best
    measured when that is not the kept one (measured above it, not shown), else the runner-up (measured
    below it, not shown below). Both are "not shown", not "the same": a second sweep that measures
    ``other_key`` above the kept one beyond noise writes a cell this one did not."""

    bucket: str
    band: str
    in_flight: int
    other_key: str
    kept_key: str


@dataclass(frozen=True)
class BucketChoice:
    """A bucket's primary config and its cells, with why each other candidate cell was not written."""

    bucket: str
    primary_key: str
    primary_config: Mapping[str, Any]
    primary_figures: BucketFigures
    cells: tuple[Cell, ...] = ()
    notes: tuple[str, ...] = ()
    undecided: tuple[Undecided, ...] = ()
    """The (band, load) comparisons left within noise: more rounds could still give them a cell."""

    @classmethod
    def of_route(cls, route: BucketRoute) -> BucketChoice:
        """A routing table's bucket as a choice (its primary and cells)."""
        return cls(route.name, route.engine_config().key(), route.config, route.figures, route.cells)

    def key_for(self, band: str, in_flight: int) -> str:
        """The engine key that serves ``band`` at ``in_flight`` under this choice."""
        cell = select_cell(self.cells, band, in_flight)
        return self.primary_key if cell is None else cell.engine_config().key()


def choose_cells(measurements: Iterable[CellMeasurement], *, primary_band: str, primary_in_flight: int,
                 level: float = 0.95, min_gain: float = 0.0,
                 primary_keys: Mapping[str, str] | None = None,
                 noise: PooledNoise | None = None) -> dict[str, BucketChoice]:
    """Per bucket: the primary (the best mean at ``primary_band`` x ``primary_in_flight``, or
    ``primary_keys[bucket]`` when the caller chose it, e.g. under a GPU budget) and a cell for every
    other (band, load level) whose best config beats the config it would otherwise get beyond the noise
    (with the sweep's pooled ``noise``: the interval of their throughput ratio lies above 1; without:
    beyond both confidence intervals) and by more than ``min_gain`` (the noise floor for figures
    measured once, whose intervals have no width). Load levels are taken in increasing order, so a cell at a higher level is
    written only where it changes the outcome. A cell found at the bucket's lowest measured level serves
    its band from one request in flight up (``min_in_flight`` 1): below that level nothing was measured,
    and the nearest evidence is that level's, not the primary's (with ``min_in_flight`` equal to the
    measured concurrency the router would send the band to the primary whenever a replica holds fewer)."""
    by_bucket: dict[str, dict[tuple[str, int], dict[str, CellMeasurement]]] = defaultdict(lambda: defaultdict(dict))
    for m in measurements:
        by_bucket[m.bucket][(m.band, m.in_flight)][m.engine_key] = m
    out: dict[str, BucketChoice] = {}
    for bucket, cells in by_bucket.items():
        home = cells.get((primary_band, primary_in_flight))
        if not home:
            raise ValueError(f"bucket {bucket}: nothing measured on the primary cell {primary_band}@{primary_in_flight}")
        forced = (primary_keys or {}).get(bucket)
        if forced is not None and forced not in home:
            raise ValueError(f"bucket {bucket}: the chosen primary {forced} was not measured on the primary cell")
        primary = home[forced] if forced is not None else max(home.values(),
                                                                key=lambda m: m.figures(level).output_throughput)
        chosen: list[Cell] = []
        notes: list[str] = []
        undecided: list[Undecided] = []
        lowest = min(level for _, level in cells)
        for band, in_flight in sorted(cells, key=lambda bl: (bl[0], bl[1])):
            if (band, in_flight) == (primary_band, primary_in_flight):
                continue
            here = cells[(band, in_flight)]
            best = max(here.values(), key=lambda m: m.figures(level).output_throughput)
            current = BucketChoice(bucket, primary.engine_key, primary.config, primary.figures(level),
                                   tuple(chosen)).key_for(band, in_flight)
            if best.engine_key == current:
                # The kept config measured best; with the pooled noise, say so where it is not shown above the
                # runner-up (a second sweep could show the runner-up above it). Figures measured once have no
                # interval to tell, and a config measured at zero none to take a ratio of.
                runner_up = max((m for k, m in here.items() if k != current),
                                key=lambda m: m.figures(level).output_throughput, default=None)
                if noise is not None and runner_up is not None and min(*best.throughputs, *runner_up.throughputs) > 0:
                    ratio = noise.ratio_interval(best.throughputs, runner_up.throughputs, level,
                                                 starts=(best.starts, runner_up.starts))
                    if ratio[1] <= 1.0:
                        undecided.append(Undecided(bucket, band, in_flight, runner_up.engine_key, current))
                        notes.append(f"{_versus(band, in_flight, best, runner_up, level)}, kept, not shown above "
                                     f"it ({_unshown(noise, ratio, level)})")
                continue
            if current not in here:
                notes.append(f"{band}@{in_flight}: {best.engine_key} is best but {current} was not measured there; "
                             "kept it")
                continue
            b, c = best.figures(level), here[current].figures(level)
            assert b.output_throughput_ci is not None and c.output_throughput_ci is not None
            ratio = (noise.ratio_interval(best.throughputs, here[current].throughputs, level,
                                          starts=(best.starts, here[current].starts))
                     if noise is not None else None)
            beyond = ratio[1] > 1.0 if ratio is not None else b.output_throughput_ci[0] > c.output_throughput_ci[1]
            if beyond and b.output_throughput > c.output_throughput * (1.0 + min_gain):
                primary_here = here.get(primary.engine_key)
                chosen.append(Cell(sampling=band, min_in_flight=1 if in_flight == lowest else in_flight,
                                   config=dict(best.config), figures=b,
                                   primary_figures=primary_here.figures(level) if primary_here else None))
            else:
                said = _versus(band, in_flight, best, here[current], level)
                if beyond and noise is not None:  # shown at the pooled noise, by too little to pay for an engine
                    notes.append(f"{said}, shown above it but by no more than {min_gain:.0%}: kept {current}")
                    continue
                # not shown (figures measured once: min_gain is their noise floor)
                undecided.append(Undecided(bucket, band, in_flight, best.engine_key, current))
                why = (_unshown(noise, ratio, level) if noise is not None and ratio is not None
                       else f"not shown above it, or gain <= {min_gain:.0%}")
                notes.append(f"{said}, within noise ({why}): kept {current}")
        out[bucket] = BucketChoice(bucket, primary.engine_key, primary.config, primary.figures(level), tuple(chosen),
                                   tuple(notes), tuple(undecided))
    return out


def _versus(band: str, in_flight: int, a: CellMeasurement, b: CellMeasurement, level: float) -> str:
    """``"band@in_flight: A n tok/s vs B m tok/s"``: how a note names a comparison."""
    return (f"{band}@{in_flight}: {a.engine_key} {a.figures(level).output_throughput:.0f} tok/s vs {b.engine_key} "
            f"{b.figures(level).output_throughput:.0f} tok/s")


def _unshown(noise: PooledNoise, ratio: tuple[float, float, float], level: float, power: float = 0.8,
             max_rounds: int = 1000) -> str:
    """Why a ratio at the pooled noise was not shown, and the rounds per config that would show a true gap
    of its size (:meth:`PooledNoise.rounds_to_separate`): "within noise" is "not shown", not "the same"."""
    r, low, high = ratio
    said = f"{r:.2f}x, {round(level * 100, 6):g} % {low:.2f}-{high:.2f}"
    if r == 1.0:
        return f"{said}; no gap measured to size more rounds for"
    rounds = noise.rounds_to_separate(r, level, power, max_rounds=max_rounds)
    at = f"at {round(power * 100, 6):g} % power"
    if rounds is None and noise.start_sd > 0 and noise.rounds_to_separate(r, level, power, max_rounds=max_rounds,
                                                                          starts=max_rounds) is not None:
        return (f"{said}; no number of rounds on one engine start would tell a gap this size apart {at} (a start "
                f"moves its rounds by {math.expm1(noise.start_sd):.1%}): rounds over several starts would")
    if rounds is None:
        return f"{said}; telling a gap this size apart {at} would take more than {max_rounds} rounds per config"
    return f"{said}; ~{rounds} rounds per config would tell a gap this size apart {at}"


def cell_measurements(rows: pd.DataFrame, b: Bucket) -> list[Any]:
    """Bucket ``b``'s successful rows as :class:`tuning.choose.cells.CellMeasurement` s: one per config x
    sampling band x concurrency, every repeat's throughput a sample and every measuring trial an engine
    start (rows from before the temperature column stand for the bucket's primary temperature; a cached
    copy of a row, :func:`is_cached_copy`, is not counted again)."""

    samples: dict[tuple[str, str, int], dict[str, list[float]]] = {}
    configs: dict[str, dict[str, Any]] = {}
    accept: dict[tuple[str, str, int], float] = {}
    rows = rows[(rows["bucket"] == b.name) & (rows["status"] == STATUS_OK) & rows["output_throughput"].notna()]
    for row in rows.to_dict("records"):
        t = row.get("temperature")
        t = b.primary_temperature if pd.isna(t) else float(t)
        band = routing.band_of(t)
        if band is None:
            continue
        if is_cached_copy(row):
            continue
        k = (str(row["engine_key"]), band.name, int(row["concurrency"]))
        samples.setdefault(k, {}).setdefault(str(row["trial_id"]), []).extend(repeat_throughputs(row))
        configs[k[0]] = config_of_row(row)
        if not pd.isna(row.get("accept_length")):
            accept[k] = float(row["accept_length"])
    return [CellMeasurement(config=configs[key], bucket=b.name, band=band, in_flight=c,
                            throughputs=tuple(x for rounds in starts.values() for x in rounds),
                            rounds_per_start=tuple(len(rounds) for rounds in starts.values()),
                            accept_length=accept.get((key, band, c)))
            for (key, band, c), starts in samples.items() if any(starts.values())]


def bucket_cells(b: Bucket, at_bucket: pd.DataFrame, primary_key: str, constraints: Constraints,
           min_gain: float, noise: PooledNoise | None = None) -> Any:
    """The bucket's :class:`tuning.choose.cells.BucketChoice` from its rows at every (temperature, concurrency):
    its cells, why others were not written (notes) and the comparisons left within noise.

    A bucket measured at one temperature has load cells only, and they hold for every sampling band
    (``sampling`` unset), as its primary does: nothing was measured to tell the bands apart."""

    eligible = at_bucket[constraints.mask(at_bucket)] if not at_bucket.empty else at_bucket
    measured = cell_measurements(eligible, b)
    primary_band = routing.band_of(b.primary_temperature)
    assert primary_band is not None
    choice = choose_cells(measured, primary_band=primary_band.name, primary_in_flight=b.primary_concurrency,
                          min_gain=min_gain, primary_keys={b.name: primary_key}, noise=noise)[b.name]
    if len(b.temperatures) > 1:
        return choice
    return dataclasses.replace(choice, cells=tuple(c.model_copy(update={"sampling": None}) for c in choice.cells))


def undecided_cells(results: pd.DataFrame, buckets: Sequence[Bucket], table: RoutingTable,
                    constraints: Constraints = NO_CONSTRAINTS) -> list[Undecided]:
    """The cell comparisons of ``table`` (chosen from ``results``) left within noise
    (:class:`tuning.choose.cells.Undecided`), against each bucket's primary as the table routes it and at the noise
    pooled over ``results``, as :func:`pick_best` decided them."""
    ok = results[(results["status"] == STATUS_OK) & results["output_throughput"].notna()]
    noise = pooled_noise(results)
    return [u for b in buckets
            for u in bucket_cells(b, ok[ok["bucket"] == b.name], table.bucket(b.name).engine_config().key(), constraints,
                            CELL_MIN_GAIN, noise).undecided]
