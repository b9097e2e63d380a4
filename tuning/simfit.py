"""Fitting a simulator profile to GPU measurements and checking it on held-out cells. Pure: measured
rows in, fitted constants and per-cell verdicts out (the simulator runs in simulated time, no I/O).

Why held-out cells: a profile fitted to every measured cell can reproduce them and still extrapolate
badly in load or temperature, which is what the router and the sweep lean on. So the cells are split
by a rule fixed before fitting (a :class:`Split`; the test checkpoint's is :data:`TEST_CKPT_SPLIT`), the constants are fitted on the FIT half only,
and the HELD-OUT half is predicted by running the simulator's own closed-loop benchmark
(:func:`orchestrator.sim.scheduler.simulate_workload`, the scheduler the simulated server uses), not an
analytic shortcut.

Why a coordinate search: the objective runs the simulator, so it is noisy at the 0.1 % level and not
differentiable; a handful of bounded constants is found reliably by shrinking steps, and scipy is not
a dependency.
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import OrchestratorError
from orchestrator.sim.model import (
    EngineParams,
    Profile,
    accept_distribution,
    expected_accept_length,
)
from orchestrator.sim.scheduler import simulate_workload
from tuning.bench.counters import counted_accept_length, outputs_per_request
from tuning.stats import PooledNoise, mean_confidence_interval

__all__ = [
    "ACCEPT_TOLERANCE",
    "ROUND_KEY",
    "SPLIT_RULE",
    "TEST_CKPT_SPLIT",
    "THROUGHPUT_TOLERANCE",
    "CellCheck",
    "MeasuredCell",
    "SimFitError",
    "Split",
    "WARM_REPEAT_PREFIXES",
    "RepeatPair",
    "WaveSetup",
    "as_counted",
    "check_cells",
    "coordinate_search",
    "fit_acceptance",
    "fit_step_overheads",
    "is_held_out",
    "landscape_cells",
    "mean_per_round",
    "repeat_noise",
    "repeat_pairs",
    "measured_cells",
    "simulate_cell",
]

THROUGHPUT_TOLERANCE = 0.10
"""Issue #18's bar for a held-out cell: simulated output throughput within ±10 % of the measured mean."""
ACCEPT_TOLERANCE = 0.15
"""Issue #18's bar for a held-out cell: simulated accept length within ±0.15 of the measured mean."""

SPLIT_RULE = (
    "HELD-OUT = every cell at concurrency 64 (load: predicted from concurrency 8 and 256, 8x on each side) "
    "+ every MTP-4 cell at T 0.8 (temperature: the sampled acceptance of draft depths 3-4 predicted from "
    "MTP-2's sampled cells and MTP-4's greedy cells); FIT = every other cell."
)
"""The split, fixed before any fit was run and never changed after seeing a result."""


class SimFitError(OrchestratorError, ValueError):
    """The measurement cannot be fitted (no cells of an engine, an unknown engine name, ...)."""


def is_held_out(num_draft_tokens: int, concurrency: int, temperature: float) -> bool:
    """The test checkpoint's split rule (:data:`SPLIT_RULE`)."""
    return concurrency == 64 or (num_draft_tokens == 4 and temperature > 0)


@dataclass(frozen=True)
class Split:
    """A rule that puts each cell in the FIT or the HELD-OUT half, fixed before any fit, and its statement."""

    rule: str
    """The rule in words, as the write-up and the profile's notes quote it."""
    held_out: Callable[[int, int, float], bool]
    """``(num_draft_tokens, concurrency, temperature) -> True`` for a held-out cell."""


TEST_CKPT_SPLIT = Split(SPLIT_RULE, is_held_out)
"""The test checkpoint's split (:func:`measured_cells`' default)."""


@dataclass(frozen=True)
class WaveSetup:
    """How one measured wave ran: the engine flags and the workload the simulator must reproduce."""

    input_len: int
    memory_fraction: float
    max_batch_size: int
    session_len: int
    max_prefill_tokens: int

    def params(self, num_draft_tokens: int) -> EngineParams:
        return EngineParams(tp=1, num_draft_tokens=num_draft_tokens, memory_fraction=self.memory_fraction,
                            max_batch_size=self.max_batch_size, session_len=self.session_len,
                            max_prefill_tokens=self.max_prefill_tokens)


@dataclass(frozen=True)
class MeasuredCell:
    """One (config, output length, concurrency, temperature, requests per wave) cell: one figure per round
    (the mean of its waves that had no failure)."""

    engine: str
    num_draft_tokens: int
    output_len: int
    concurrency: int
    temperature: float
    throughputs: tuple[float, ...]
    accept_lengths: tuple[float, ...]
    excluded_waves: int
    num_prompts: int = 0
    """Requests per wave (``measure_turbomind.py --num-prompts``); 0: as many as the concurrency."""
    counted_outputs: float | None = None
    """Decode outputs per request that LMDeploy's counters saw (harmonic mean over the cell's waves: the
    counted figure's bias goes with one over it; None where the rows lack the counters' deltas): the accept
    length measured is a figure counted over these."""
    waves: tuple[int, ...] = ()
    """Measured waves behind each round's figure (:func:`mean_per_round`), round by round."""
    agreement: float | None = None
    """The constructed checkpoint's agreement level (its own acceptance); None: MTP off, or not constructed."""
    split: Split = field(default=TEST_CKPT_SPLIT, compare=False, repr=False)
    """The rule that says whether this cell is held out."""

    @property
    def requests(self) -> int:
        """Requests per wave, as the bench sent them."""
        return self.num_prompts or self.concurrency

    @property
    def name(self) -> str:
        extra = f" n{self.requests}" if self.requests != self.concurrency else ""
        return f"{self.engine} o{self.output_len} c{self.concurrency} T{self.temperature:g}{extra}"

    @property
    def held_out(self) -> bool:
        return self.split.held_out(self.num_draft_tokens, self.concurrency, self.temperature)

    @property
    def throughput(self) -> float:
        """The measured figure: the mean of the rounds."""
        return statistics.fmean(self.throughputs)

    @property
    def throughput_half_spread(self) -> float | None:
        """Half the rounds' range over their mean: the measurement's own ± (None from one round)."""
        if len(self.throughputs) < 2:
            return None
        return (max(self.throughputs) - min(self.throughputs)) / 2 / self.throughput

    @property
    def throughput_ci(self) -> tuple[float, float] | None:
        """The 95 % t-interval of the mean of the rounds (None from one round). Unlike the rounds' range,
        it narrows as rounds are added: whether a cell can be judged at ±10 % is a question of this."""
        if len(self.throughputs) < 2:
            return None
        _, low, high = mean_confidence_interval(self.throughputs)
        return low, high

    @property
    def accept_length(self) -> float | None:
        return statistics.fmean(self.accept_lengths) if self.accept_lengths else None

    @property
    def accept_half_spread(self) -> float | None:
        if len(self.accept_lengths) < 2:
            return None
        return (max(self.accept_lengths) - min(self.accept_lengths)) / 2

    def to_dict(self) -> dict[str, Any]:
        out = {"engine": self.engine, "num_draft_tokens": self.num_draft_tokens, "output_len": self.output_len,
               "concurrency": self.concurrency, "temperature": self.temperature, "held_out": self.held_out,
               "requests": self.requests, "counted_outputs": self.counted_outputs, "throughputs": list(self.throughputs),
               "accept_lengths": list(self.accept_lengths), "excluded_waves": self.excluded_waves}
        return out if self.agreement is None else {**out, "agreement": self.agreement}


def _draft_tokens(engine: str, engines: Mapping[str, Mapping[str, Any]]) -> int:
    spec = engines.get(engine)
    if spec is None:
        raise SimFitError(f"rows name engine {engine!r} that the measurement's 'engines' section lacks")
    return int(spec.get("num_draft_tokens") or 0)


ROUND_KEY = ("run", "round", "engine", "output_len", "concurrency", "temperature")
"""What one round's figure of one cell is made of: every wave of that engine start (``run``, ``round``)
at that (engine, output length, concurrency, temperature). Requests per wave are not in it: one engine
start (one run) sends one number of requests per concurrency, and runs are told apart by ``run``."""


def mean_per_round(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per round of a cell (:data:`ROUND_KEY`; a missing ``run`` is run 0), in run and round order:
    the mean output throughput and accept length of its waves (``measure_turbomind.py --waves``), ``waves``
    how many. Waves of one engine start share its state and its drift, so a cell's spread and interval
    are taken over rounds, each the mean of its waves, never over waves as if each were a start."""
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[tuple(r.get(k, 0) if k == "run" else r[k] for k in ROUND_KEY)].append(r)
    out = []
    for key in sorted(groups, key=lambda k: (k[0], k[1])):
        waves = groups[key]
        accepts = [float(r["accept_length"]) for r in waves if r.get("accept_length")]
        out.append({**waves[0], "output_throughput": statistics.fmean(float(r["output_throughput"]) for r in waves),
                    "accept_length": statistics.fmean(accepts) if accepts else None, "waves": len(waves)})
    return out


def measured_cells(rows: Iterable[Mapping[str, Any]], engines: Mapping[str, Mapping[str, Any]], *,
                   backend: str = "pytorch", split: Split = TEST_CKPT_SPLIT) -> list[MeasuredCell]:
    """The cells of one engine backend from per-wave rows, one figure per round (:func:`mean_per_round`).
    A row's ``num_prompts`` (requests per wave; missing or 0: as many as the concurrency) is part of its
    cell: waves of more requests than the concurrency are another workload. A wave with a failed request
    is left out (its throughput counts a missing request's time). Cells left with no wave are dropped."""
    ours = [r for r in rows if engines.get(r["engine"], {}).get("backend") == backend]

    def cell_key(r: Mapping[str, Any]) -> tuple[str, int, int, float, int]:
        c = int(r["concurrency"])
        n = int(r.get("num_prompts") or c)
        return r["engine"], int(r["output_len"]), c, float(r["temperature"]), 0 if n == c else n

    failed: dict[tuple, int] = defaultdict(int)
    by_cell: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    outputs: dict[tuple, list[float]] = defaultdict(list)
    for r in ours:
        key = cell_key(r)
        failed[key] += bool(r.get("failed"))
        by_cell.setdefault(key, [])
        seen = None if r.get("failed") else outputs_per_request(r.get("spec_counters") or {}, int(r.get("completed") or 0))
        if seen is not None:
            outputs[key].append(seen)
    for r in mean_per_round(r for r in ours if not r.get("failed")):
        by_cell[cell_key(r)].append(r)
    cells = []
    for key, rounds in sorted(by_cell.items()):
        if not rounds:
            continue
        engine, output_len, concurrency, temperature, num_prompts = key
        n_draft = _draft_tokens(engine, engines)
        cells.append(MeasuredCell(
            engine=engine, num_draft_tokens=n_draft, output_len=output_len, concurrency=concurrency,
            temperature=temperature, throughputs=tuple(r["output_throughput"] for r in rounds),
            accept_lengths=tuple(r["accept_length"] for r in rounds if n_draft and r["accept_length"]),
            excluded_waves=failed[key], num_prompts=num_prompts,
            counted_outputs=statistics.harmonic_mean(outputs[key]) if outputs[key] else None,
            waves=tuple(r["waves"] for r in rounds), split=split))
    if not cells:
        raise SimFitError(f"no wave of a {backend!r} engine without failures in the measurement")
    return cells


LANDSCAPE_CELL_FIELDS = ("engine", "draft_tokens", "output_len", "temperature", "concurrency", "output_throughput",
                         "completed")
"""What each cell of a ``measure_landscape.py`` file must hold to be fitted."""


def landscape_cells(landscapes: Sequence[Mapping[str, Any]], split: Split) -> list[MeasuredCell]:
    """The cells of one or more ``measure_landscape.py`` files (``landscape.json``), pooled by their key
    (``engine|out|T|c``): each file that holds a key gives that cell one round (one closed-loop run of
    ``completed + failed`` requests at the cell's concurrency), so a cell measured in two leases has two
    rounds. A run with a failed request is left out (its throughput counts a missing request's time); a cell
    left with no run is dropped. Outputs per request seen by the counters: from each run's deltas,
    harmonic mean over the runs (as :func:`measured_cells`)."""
    runs: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for i, landscape in enumerate(landscapes):
        cells = landscape.get("cells") if isinstance(landscape, Mapping) else None
        if not isinstance(cells, Mapping):
            raise SimFitError(f"landscape {i} has no 'cells' mapping; is it a measure_landscape.py landscape.json?")
        if landscape.get("simulated"):
            raise SimFitError(f"landscape {i} is SIMULATED (measure_landscape.py --sim): a fit needs GPU measurements")
        for key, cell in cells.items():
            missing = [f for f in LANDSCAPE_CELL_FIELDS if f not in cell]
            if missing:
                raise SimFitError(f"landscape {i}, cell {key!r} lacks {missing}")
            if any(r == cell for r in runs[key]):  # a lease's file is seeded with the one before it
                raise SimFitError(f"landscape {i}, cell {key!r}: the same run is in an earlier file too; pass only "
                                  "the newest landscape.json of a series (it holds the earlier leases' cells)")
            runs[key].append(cell)
    out = []
    for key in sorted(runs):
        kept = [r for r in runs[key] if not r.get("failed")]
        if not kept:
            continue
        first = kept[0]
        n_draft = int(first["draft_tokens"])
        if any(int(r["draft_tokens"]) != n_draft or r.get("agreement") != first.get("agreement") for r in kept):
            raise SimFitError(f"cell {key!r} names different draft counts or agreement levels in different files")
        requests = {int(r["completed"]) + int(r.get("failed") or 0) for r in kept}
        if len(requests) != 1:
            raise SimFitError(f"cell {key!r} ran {sorted(requests)} requests in different files; fit them apart")
        seen = [o for r in kept if (o := outputs_per_request(r.get("spec_counters") or {}, int(r["completed"])))]
        accepts = tuple(float(r["accept_length"]) for r in kept if n_draft and r.get("accept_length"))
        out.append(MeasuredCell(
            engine=first["engine"], num_draft_tokens=n_draft, output_len=int(first["output_len"]),
            concurrency=int(first["concurrency"]), temperature=float(first["temperature"]),
            throughputs=tuple(float(r["output_throughput"]) for r in kept), accept_lengths=accepts,
            excluded_waves=len(runs[key]) - len(kept), num_prompts=requests.pop(),
            counted_outputs=statistics.harmonic_mean(seen) if seen else None, waves=tuple(1 for _ in kept),
            agreement=None if first.get("agreement") is None else float(first["agreement"]), split=split))
    if not out:
        raise SimFitError("no landscape cell without failed requests to fit")
    return out


WARM_REPEAT_PREFIXES = ("mtp-off|out512|T0|",)
"""Landscape cells measured again (``measure_landscape.py --redo``) whose earlier run was warm as well: MTP off's
output-512 greedy cells came after that engine had served every concurrency twice. The other cells measured
again (MTP off's output-128 greedy ones) were a fresh engine's first pass over each concurrency, a start-up
cost paid once (they read up to half the re-measured figure), not run-to-run noise."""


@dataclass(frozen=True)
class RepeatPair:
    """One landscape cell measured twice, in two leases: its earlier (superseded) and its current throughput."""

    key: str
    earlier: float
    later: float
    run_s: tuple[float | None, float | None] = (None, None)

    @property
    def log_ratio(self) -> float:
        return math.log(self.later / self.earlier)


def repeat_pairs(landscape: Mapping[str, Any],
                 prefixes: Sequence[str] = WARM_REPEAT_PREFIXES) -> tuple[list[RepeatPair], list[RepeatPair]]:
    """(used, not used): each superseded cell's latest earlier run beside its current figure; used when its key
    starts with one of ``prefixes``."""
    used, other = [], []
    for key, older in sorted((landscape.get("superseded") or {}).items()):
        now = landscape["cells"].get(key)
        if not older or not now:
            continue
        pair = RepeatPair(key, float(older[-1]["output_throughput"]), float(now["output_throughput"]),
                          (older[-1].get("duration_s"), now.get("duration_s")))
        (used if any(key.startswith(p) for p in prefixes) else other).append(pair)
    return used, other


def repeat_noise(pairs: Sequence[RepeatPair]) -> PooledNoise | None:
    """One run's log sd from repeat pairs, each pair's two runs about their own mean (one degree of freedom a
    pair: a shift between two leases counts as noise, as it would between any two cells); ``None`` without a
    pair. Why repeats and not two cells the model treats alike: greedy and sampled MTP off differ by the
    engine's sampling work, which a landscape shows (greedy reads faster at low load), so such pairs mix a real
    cost into the noise."""
    return PooledNoise.of([(p.earlier, p.later) for p in pairs])


def simulate_cell(profile: Profile, cell: MeasuredCell, setup: WaveSetup, *, seed: int = 0) -> tuple[float, float | None]:
    """(output tok/s, accept length) of the cell's wave run by the simulator in simulated time: the wave's
    requests of fixed lengths at the cell's concurrency, closed loop, as measured."""
    s = simulate_workload(profile, input_len=setup.input_len, output_len=cell.output_len, range_ratio=1.0,
                          num_prompts=cell.requests, concurrency=cell.concurrency,
                          temperature=cell.temperature, seed=seed, params=setup.params(cell.num_draft_tokens))
    return s.output_throughput, s.accept_length


def as_counted(profile: Profile, cell: MeasuredCell, tokens_per_step: float) -> float:
    """The accept length LMDeploy's counters would report for a cell whose engine emits ``tokens_per_step``:
    the figure itself where the cell's counters saw no outputs per request, else counted over those outputs
    (the last step length-biased, at the end of the output; :func:`tuning.bench.counters.counted_accept_length`).
    So a measured figure is compared with what the same counting would make of the model's."""
    if cell.counted_outputs is None or not cell.num_draft_tokens:
        return tokens_per_step
    last = accept_distribution(profile, cell.num_draft_tokens, cell.temperature, cell.output_len - 1)
    return counted_accept_length(tokens_per_step, last, max(cell.counted_outputs, 1.0))


def coordinate_search(objective: Callable[[Mapping[str, float]], float], start: Mapping[str, float],
                      bounds: Mapping[str, tuple[float, float]], *, rel_step: float = 0.25,
                      min_rel_step: float = 0.005, max_evals: int = 2000) -> tuple[dict[str, float], float]:
    """Minimise ``objective`` over the named constants inside ``bounds``: try each constant up and down by
    a step (a share of its bounds' width), keep any improvement, halve the step when none helps."""
    for name, (lo, hi) in bounds.items():
        if not lo < hi:
            raise SimFitError(f"bounds of {name!r} are empty: {lo}..{hi}")
    point = {k: min(max(float(start[k]), bounds[k][0]), bounds[k][1]) for k in bounds}
    best = objective(point)
    evals, step = 1, rel_step
    while step >= min_rel_step and evals < max_evals:
        improved = False
        for name, (lo, hi) in bounds.items():
            for sign in (1.0, -1.0):
                trial = dict(point)
                trial[name] = min(max(point[name] + sign * step * (hi - lo), lo), hi)
                if trial[name] == point[name]:
                    continue
                value = objective(trial)
                evals += 1
                if value < best:
                    point, best, improved = trial, value, True
                    break
        if not improved:
            step /= 2
    return point, best


ACCEPT_BOUNDS = {"accept_p0": (0.5, 0.999), "accept_temperature_slope": (0.0, 8.0),
                 "accept_depth_penalty": (-1.0, 3.0), "accept_log_slope": (-2.0, 4.0)}
"""The acceptance constants fitted and their bounds (``accept_pos_scale`` is held: with two output lengths
the position curve has one degree of freedom, its log slope)."""

STEP_BOUNDS = {"decode_overhead_per_seq_ms": (0.0, 0.1), "prefill_overhead_ms": (0.0, 50.0),
               "prefill_overhead_per_token_us": (0.0, 80.0), "draft_overhead_ms": (0.0, 10.0),
               "mtp_verify_overhead_ms": (0.0, 15.0), "mtp_prefill_overhead_ms": (0.0, 200.0)}
"""The step constants fitted and their bounds: host-side overheads, which are the whole step of a
launch-bound model (the GPU efficiencies are a rounding error of such a step and are held). The fixed
decode-step overhead is held too: a profile's TurboMind section, and the published profile's stated
TurboMind assumption, are derived from it."""


def fit_acceptance(profile: Profile, cells: Sequence[MeasuredCell], *,
                   bounds: Mapping[str, tuple[float, float]] = ACCEPT_BOUNDS) -> tuple[dict[str, float], float]:
    """Acceptance constants minimising the squared accept-length error over the MTP cells given (the
    model's analytic accept length of a fixed-length wave; the check then samples it in the simulator),
    each cell weighted by its requests per wave: a wave's accept length is a mean over its prompts, and its
    error from the prompt draw shrinks with their number. Returns the constants and the weighted
    root-mean-square error."""
    mtp = [c for c in cells if c.num_draft_tokens and c.accept_length is not None]
    if not mtp:
        raise SimFitError("no MTP cell with an accept length to fit the acceptance to")

    def sse(point: Mapping[str, float]) -> float:
        p = profile.replace(**point)
        return sum(c.requests * (as_counted(p, c, expected_accept_length(p, c.num_draft_tokens, c.temperature,
                                                                         c.output_len, 1.0)) - c.accept_length) ** 2
                   for c in mtp)

    point, best = coordinate_search(sse, {k: getattr(profile, k) for k in bounds}, bounds, min_rel_step=0.001)
    return point, math.sqrt(best / sum(c.requests for c in mtp))


CellProfile = Callable[[Profile, MeasuredCell], Profile]
"""The profile a cell runs under, from the profile being fitted (e.g. with its agreement level's acceptance)."""


def _same(profile: Profile, cell: MeasuredCell) -> Profile:
    return profile


def fit_step_overheads(profile: Profile, cells: Sequence[MeasuredCell], setup: WaveSetup, *,
                       bounds: Mapping[str, tuple[float, float]] = STEP_BOUNDS, cell_profile: CellProfile = _same,
                       max_evals: int = 2000, min_rel_step: float = 0.005) -> tuple[dict[str, float], float]:
    """Step constants minimising the squared log error of simulated vs measured output throughput over the
    cells given (each simulated wave as :func:`simulate_cell` runs it, under ``cell_profile`` of the
    constants tried). Returns the constants and the root-mean-square relative error (log)."""
    if not cells:
        raise SimFitError("no cell to fit the step constants to")

    def sse(point: Mapping[str, float]) -> float:
        p = profile.replace(**point)
        return sum(math.log(simulate_cell(cell_profile(p, c), c, setup)[0] / c.throughput) ** 2 for c in cells)

    point, best = coordinate_search(sse, {k: getattr(profile, k) for k in bounds}, bounds, max_evals=max_evals,
                                    min_rel_step=min_rel_step)
    return point, math.sqrt(best / len(cells))


@dataclass(frozen=True)
class CellCheck:
    """A held-out cell: the simulator's figures against the measured means and the bars."""

    cell: MeasuredCell
    sim_throughput: float
    sim_accept_length: float | None

    @property
    def throughput_error(self) -> float:
        return self.sim_throughput / self.cell.throughput - 1

    @property
    def throughput_ok(self) -> bool:
        return abs(self.throughput_error) <= THROUGHPUT_TOLERANCE

    @property
    def within_rounds(self) -> bool:
        return min(self.cell.throughputs) <= self.sim_throughput <= max(self.cell.throughputs)

    @property
    def spread_exceeds_tolerance(self) -> bool:
        """The rounds themselves differ by more than ±10 %: the cell cannot be judged at ±10 %."""
        half = self.cell.throughput_half_spread
        return half is not None and half > THROUGHPUT_TOLERANCE

    @property
    def throughput_verdict(self) -> str | None:
        """The ±10 % bar judged against the 95 % interval of the measured mean: ``"pass"`` when every mean
        the interval allows is within ±10 % of the simulated figure, ``"fail"`` when none is, ``"undecided"``
        when the interval straddles the bar's edge (the measurement cannot say); None from one round."""
        ci = self.cell.throughput_ci
        if ci is None:
            return None
        lo, hi = self.sim_throughput / (1 + THROUGHPUT_TOLERANCE), self.sim_throughput / (1 - THROUGHPUT_TOLERANCE)
        if lo <= ci[0] and ci[1] <= hi:
            return "pass"
        if ci[1] < lo or ci[0] > hi:
            return "fail"
        return "undecided"

    @property
    def accept_error(self) -> float | None:
        if self.sim_accept_length is None or self.cell.accept_length is None:
            return None
        return self.sim_accept_length - self.cell.accept_length

    @property
    def accept_ok(self) -> bool | None:
        err = self.accept_error
        return None if err is None else abs(err) <= ACCEPT_TOLERANCE

    def to_dict(self) -> dict[str, Any]:
        c = self.cell
        return {"cell": c.name, **c.to_dict(),
                "measured_throughput": round(c.throughput, 1),
                "measured_half_spread": None if c.throughput_half_spread is None else round(c.throughput_half_spread, 4),
                "sim_throughput": round(self.sim_throughput, 1), "throughput_error": round(self.throughput_error, 4),
                "throughput_ok": self.throughput_ok, "within_rounds": self.within_rounds,
                "spread_exceeds_tolerance": self.spread_exceeds_tolerance,
                "measured_ci": None if c.throughput_ci is None else [round(x, 1) for x in c.throughput_ci],
                "throughput_verdict": self.throughput_verdict,
                "measured_accept_length": None if c.accept_length is None else round(c.accept_length, 4),
                "measured_accept_half_spread": (None if c.accept_half_spread is None
                                                else round(c.accept_half_spread, 4)),
                "sim_accept_length": None if self.sim_accept_length is None else round(self.sim_accept_length, 4),
                "accept_error": None if self.accept_error is None else round(self.accept_error, 4),
                "accept_ok": self.accept_ok}


def check_cells(profile: Profile, cells: Sequence[MeasuredCell], setup: WaveSetup, *,
                cell_profile: CellProfile = _same) -> list[CellCheck]:
    """Each cell simulated with ``profile`` (under ``cell_profile``) and compared with its measurement (the
    accept length as the cell's counters would count the simulated one: :func:`as_counted`)."""
    checks = []
    for c in cells:
        p = cell_profile(profile, c)
        throughput, accept = simulate_cell(p, c, setup)
        checks.append(CellCheck(c, throughput, None if accept is None else as_counted(p, c, accept)))
    return checks
