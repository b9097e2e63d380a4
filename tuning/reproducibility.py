"""Two independent sweeps of one space, compared, apart from running them: the weights both must have
measured, where their specs may differ, the flags a reproducibility sweep adds to the sweep command, the
stated traffic mix as requests, and the routes two tables must agree on.

Why in the package: ``benchmarks/gpu/measure_reproducibility.py`` runs the sweeps on a GPU and serves their
tables side by side; these pure parts are what its tests check, and a test imports them from here, never
from a benchmark script.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import table as routing
from tuning.traffic import TrafficMix

__all__ = ["SEEDS", "STOP_MARGIN_S", "WEIGHTS_RECORD", "Stop", "choices", "later_call", "mix_requests", "noise_space",
           "parse_sim_noise", "route_differences", "routes", "spec_differences", "stop_after_sweeps", "sweep_flags", "weights",
           "weights_differences"]

WEIGHTS_RECORD = "weights.json"

SEEDS = {"a": 0, "b": 1}
"""The two sweeps by name, each with its search seed."""
STOP_MARGIN_S = 210.0
"""Seconds a sweep keeps, after its hard limit (``--stop-after-s``), before ``--sweep-timeout-s``: the round in
progress (a fresh engine's first holds its burn-in: ~65 s on the H200), the engines' stops one at a time under
the GPU lease, the reports and the table; the limit counts from the sweep's start, after Ray's connect."""


def spec_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Where two sweeps' specs (``sweep.json``) differ beyond what two independent sweeps of one space may:
    their seeds, ids and run dirs, and where they ran (``tokenizer``: the checkpoint's path)."""
    own = {"sweep_id", "run_dir", "seed", "tokenizer", "routing_table", "max_concurrent_trials"}
    return [f"{k}: {a.get(k)!r} vs {b.get(k)!r}"[:200] for k in sorted((set(a) | set(b)) - own) if a.get(k) != b.get(k)]


def parse_sim_noise(text: str) -> tuple[float, float]:
    """``START_SD,SD`` for ``--sim-noise``."""
    from orchestrator.sim.noise import EngineNoise

    try:
        start_sd, sd = (float(x) for x in text.split(","))
        EngineNoise(start_sd=start_sd, sd=sd)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: two log sds START_SD,SD in [0, 2] ({e})") from None
    return start_sd, sd


def later_call(argv: list[str], tags: list[str]) -> list[str]:
    """``argv`` for the call that runs sweeps ``tags``: its ``--sweeps``, ``--work`` and ``--reuse`` left out
    (the caller names the new ones)."""
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x in ("--sweeps", "--work"):
            skip = True
        elif not x.startswith(("--sweeps=", "--work=")) and x != "--reuse":
            out.append(x)
    return [*out, "--sweeps", ",".join(tags)]


def weights(ckpt: str, sim: bool) -> dict[str, Any]:
    """What the sweeps measure on: every weights file of the checkpoint with its sha256."""
    if sim:
        return {"simulated": True}
    from tuning.checkpoint.build import weights_sha256

    files = sorted(Path(ckpt).glob("*.safetensors"))
    if not files:
        raise SystemExit(f"{ckpt}: no *.safetensors weights to measure")
    return {"files": {f.name: weights_sha256(f) for f in files}}


def weights_differences(now: Mapping[str, Any], work: Path, tags: Sequence[str]) -> list[str]:
    """The sweeps in ``work`` not shown to have measured ``now``'s weights: another record, or none (a
    table from before the record, or copied without it)."""
    differ = []
    for tag in tags:
        path = work / f"sweep-{tag}" / WEIGHTS_RECORD
        if not path.exists():
            differ.append(f"sweep {tag} has no {WEIGHTS_RECORD} (its weights are unknown)")
        elif (then := json.loads(path.read_text())) != now:
            differ.append(f"sweep {tag} measured {_short(then)}, this run has {_short(now)}")
    return differ


def _short(record: Mapping[str, Any]) -> str:
    if record.get("simulated"):
        return "simulated engines"
    return ", ".join(f"{name} {digest[:16]}" for name, digest in sorted(record.get("files", {}).items())) or "no weights"


def mix_requests(buckets: Sequence[Any], mix: TrafficMix, tokenizer: Any, total: int,
                 seed: int = 0) -> list[tuple[str, int, float]]:
    """The stated mix as requests: each class's share of ``total`` (at least one), drawn in turn from the
    sweep workload of the bucket its ``max_tokens`` falls in (lengths capped at ``max_tokens``), at the
    class's temperature; shuffled. A class larger than its bucket's workload repeats prompts, and the
    classes of one bucket share them; both tables get the same requests, so their ratio is unaffected."""
    import random

    from tuning.workload import build_requests

    pools = {b.name: build_requests(b.workload_at(b.primary_concurrency), tokenizer) for b in buckets}
    reqs: list[tuple[str, int, float]] = []
    for i, (c, share) in enumerate(mix.normalised()):
        bucket = next((b for b in buckets if c.max_tokens <= b.max_output_len), buckets[-1])
        pool = pools[bucket.name]
        for k in range(max(1, round(share * total))):
            r = pool[(k + i) % len(pool)]
            reqs.append((r.prompt, min(r.output_len, c.max_tokens), mix.temperature_of(c)))
    random.Random(seed).shuffle(reqs)
    return reqs


def routes(table: routing.RoutingTable, in_flight: Sequence[int]) -> dict[str, str]:
    """Where ``table`` sends a request of each bucket x sampling band at each of ``in_flight`` requests in
    flight per replica (cells, else the bucket's config): what two tables must agree on to make the same
    choices (the set of configs can match while the routing differs). Load variants are not read (these
    sweeps write none)."""
    return {f"{b.name} {band.name}@{n}": (b.cell_for(band.name, n) or b).engine_config().label()
            for b in table.buckets for band in table.sampling_bands for n in in_flight}


def route_differences(a: Mapping[str, str], b: Mapping[str, str]) -> list[str]:
    """The routes of two tables that differ, as ``"<route>: <a's config> vs <b's>"``."""
    return [f"{k}: {a.get(k)} vs {b.get(k)}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def choices(table: routing.RoutingTable) -> dict[str, Any]:
    return {b.name: {"config": b.engine_config().label(), "figures": b.figures.model_dump(mode="json"),
                     "cells": [f"{c.sampling}@{c.min_in_flight}: {c.engine_config().label()}" for c in b.cells]}
            for b in table.buckets} | {"notes": list(table.provenance.notes)}


def noise_space(a: Any) -> dict[str, Any] | None:
    """With ``--sim --sim-noise``: the sweep's ``--space`` that makes every simulated engine vary (its noise
    flags after the default space's own, which the sweep would take); ``None`` otherwise. ``a``: the
    script's flags."""
    if not (a.sim and a.sim_noise and any(a.sim_noise)):
        return None
    from tuning.sweep.spec import default_space, load_defaults

    base = default_space(load_defaults(), simulated=True).get("extra_flags", [])  # what the sweep would take
    return {"extra_flags": [*base, "--noise-start-sd", f"{a.sim_noise[0]:g}", "--noise-sd", f"{a.sim_noise[1]:g}"]}


def sweep_flags(a: Any, space: Path | None) -> list[str]:
    """What a reproducibility sweep adds to the e2e run's sweep command: the temperatures, the stated mix, the
    decide phase, burn-in (real engines) and baseline memory fraction when given, ``space`` (the file of
    :func:`noise_space`, when there is one), and a hard limit that leaves the sweep :data:`STOP_MARGIN_S` to
    commit a table before ``--sweep-timeout-s`` kills it (never before the time budget)."""
    flags = ["--temperatures", a.temperatures, "--traffic-mix", a.traffic_mix, "--decide-rounds", str(a.decide_rounds),
             "--decide-starts", str(a.decide_starts)]
    if a.burn_in_s is not None and not a.sim:
        flags += ["--burn-in-s", f"{a.burn_in_s:g}"]
    if a.baseline_memory_fraction is not None:
        flags += ["--baseline-memory-fraction", f"{a.baseline_memory_fraction:g}"]
    if space is not None:
        flags += ["--space", str(space)]
    return [*flags, "--stop-after-s", f"{max(a.time_budget_s, a.sweep_timeout_s - STOP_MARGIN_S):g}"]


@dataclass(frozen=True)
class Stop:
    """Where a call stops before serving the tables: ``key`` names what ``text`` is in the result (``"error"``
    or ``"next"``: how a later call goes on), ``rc`` the exit status."""

    key: str
    text: str
    rc: int


def stop_after_sweeps(run_now: Sequence[str], *, reuse: bool, no_side_by_side: bool, present: Mapping[str, bool],
                      read_spec: Callable[[str], Mapping[str, Any]], again: list[str], work: Path,
                      script: str) -> Stop | None:
    """What a call does once its sweeps (``run_now``) ran: stop with an error (a sweep of this call committed
    no table; a serve-only call without both tables; sweeps of different spaces), stop and say how a later
    call goes on (the other sweep is for a later lease; ``no_side_by_side``), or ``None``: serve both side by
    side. ``present``: whether each sweep's table is in ``work``; an earlier call's table counts only with
    ``reuse``. ``again``: this call's arguments, from which the later call's are made (``script`` runs it)."""
    missing = [tag for tag in SEEDS if not present[tag] or (tag not in run_now and not reuse)]
    if missing and any(t in run_now for t in missing):
        return Stop("error", f"sweep {', '.join(t for t in missing if t in run_now)} committed no table", 1)
    if missing and not run_now:
        return Stop("error", f"--sweeps none serves two committed tables: no table of sweep {', '.join(missing)} "
                    f"in {work}", 1)
    if missing:  # the other sweep is for a later call: this one's table is in --work (and its run in --out)
        return Stop("next", f"sweep {', '.join(missing)} has no table here yet: in a later call (a later lease, "
                    f"the same checkpoint) run {script} {' '.join(later_call(again, missing))} "
                    f"--reuse --work <a copy of {work}>, which then serves both tables side by side", 0)
    if differ := spec_differences(*(dict(read_spec(t)) for t in SEEDS)):
        return Stop("error", f"the two sweeps measured different spaces ({'; '.join(differ)}): their tables do "
                    "not compare", 1)
    if no_side_by_side:
        later = [x for x in later_call(again, ["none"]) if x != "--no-side-by-side"]
        return Stop("next", f"both tables are in {work}: in a later call (a later lease, the same checkpoint) run "
                    f"{script} {' '.join(later)} --reuse --work <a copy of {work}> to serve them side by side", 0)
    return None
