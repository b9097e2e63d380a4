"""How often two independent sweeps of one space commit tables within 3 % of each other on the mix, by
``--decide-rounds`` and ``--decide-starts``: the sweep's own choosing code (:func:`tuning.choose.table.choose_table`,
and its decide phase, :func:`tuning.sweep.decide.decide_phase`) run on measurements drawn from a noise model,
many times.

Why a model and not the GPU: whether two sweeps agree is a probability, and one pair of GPU sweeps (issue
#22 item 2's run) is one draw of it. The model takes its truth and its noise from that run's own
measurements (``benchmarks/results/gpu_repro_h200_2026-12-04``): each config's throughput on each bucket x
temperature is the geometric mean of all its rounds in both sweeps, and one round moves by the log sd
pooled over both sweeps. A round is that truth times ``exp(N(0, round sd))``, times one
``exp(N(0, start sd))`` per engine start, shared by every cell it measures: the variation between engine
starts, by default as the two sweeps show it (each config was started once in each: :class:`tuning.stats.PooledNoise` ``start_sd``). The decide
phase draws its rounds on fresh engine starts, ``--decide-starts`` of them per config, as
``tuning.sweep.decide.run_decision`` measures them.

Each committed table is scored on the truth (:func:`tuning.choose.prediction.predict_on_mix` with one round per
config at its true rate): two tables' ratio on the mix, and each one's ratio to the reference, the table a
sweep commits from the true rates themselves (no noise). Pure CPU; SIMULATED measurements, real choosing code.

    python -m docs.analyses.repro_power.repro_power --pairs 400 --decide-rounds 0,2,4,8 --decide-starts 1,2
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import io
import json
import math
import platform
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.hostinfo import git_commit
from tuning.choose.cells import BucketChoice
from tuning.choose.decision import ROLE_DECIDE
from tuning.choose.noise import pooled_noise
from tuning.choose.prediction import predict_on_mix
from tuning.choose.table import choose_table
from tuning.results import (
    STATUS_OK,
    repeat_throughputs,
    results_frame,
    rows_for_trial,
)
from tuning.sweep.decide import decide_phase, sweep_rows
from tuning.sweep.measure import representative_run
from tuning.sweep.provenance import provenance_for
from tuning.sweep.records import ResultRow
from tuning.sweep.spec import SweepSpec, resumed_spec
from tuning.traffic import load_mix

ROOT = Path(__file__).resolve().parents[3]

RUN = ROOT / "benchmarks/results/gpu_repro_h200_2026-12-04"
MIX = ROOT / "benchmarks/gpu/payoff_mix_test_ckpt.yaml"
TOLERANCE = 0.03  # issue #22 item 2: within 3 % of each other on the mix


@dataclasses.dataclass(frozen=True)
class Truth:
    """Each config's true output tok/s per (bucket, temperature), and the noise of one round."""

    rates: Mapping[tuple[str, str, float], float]  # (engine key, bucket, temperature) -> tok/s
    round_sd: float
    source: str
    start_sd: float = 0.0  # as the run's two starts of each config show it
    start_df: int = 0


def truth_from_run(run: Path = RUN) -> Truth:
    """The geometric mean of every round each config made on each cell in both sweeps of ``run``, and the
    noise of one round and of one engine start pooled over both (:func:`tuning.results.pooled_noise`; each
    sweep's ``results.csv``, kept in ``work/sweep-<name>/`` beside its table and spec)."""
    frames = [pd.read_csv(run / "work" / f"sweep-{name}" / "results.csv") for name in ("a", "b")]
    df = pd.concat(frames, ignore_index=True)
    rounds: dict[tuple[str, str, float], list[float]] = defaultdict(list)
    for row in df[(df["status"] == STATUS_OK) & df["output_throughput"].notna()].to_dict("records"):
        rounds[(row["engine_key"], row["bucket"], float(row["temperature"]))].extend(repeat_throughputs(row))
    noise = pooled_noise(df)
    if noise is None:
        raise SystemExit(f"{run}: no measurement in rounds to take the noise from")
    rates = {k: math.exp(float(np.mean(np.log(v)))) for k, v in rounds.items()}
    return Truth(rates, noise.sd, f"{run.relative_to(ROOT)} (sweeps a and b, {noise.df} df)", noise.start_sd,
                 noise.start_df)


def _bench(rounds: Sequence[float]) -> dict[str, Any]:
    """A benchmark result as a trial reports one measured in ``rounds``: the run that stands for them as the
    sweep picks it (:func:`tuning.sweep.measure.representative_run`), with the fields the results rows read."""
    return representative_run([{"output_throughput": x, "completed": 64, "failed": 0, "failure_reasons": {},
                                "simulated": True} for x in rounds])


class Sweeper:
    """One sweep of ``spec``'s space on measurements drawn from ``truth``: first rounds, then (with
    ``decide_rounds``) the decide phase's rounds on fresh engines, and the table the sweep commits."""

    def __init__(self, spec: SweepSpec, truth: Truth, traffic: Any, *, start_sd: float = 0.0) -> None:
        self.spec, self.truth, self.traffic, self.start_sd = spec, truth, traffic, start_sd
        built = [(p.role, spec.space.config_from_trial_config(p.params)) for p in spec.space.points]
        self.configs = {c.key(): c for _, c in built}
        self.roles = {c.key(): role for role, c in built}

    def rows(self, key: str, buckets: Sequence[Any], rounds: int, role: str,
             rng: np.random.Generator | None = None, trial_id: str | None = None) -> list[ResultRow]:
        """``key``'s rows from one engine start measuring ``buckets`` in ``rounds`` rounds, as trial
        ``trial_id`` (default: ``role``) in ``role`` (without ``rng``: at the true rates)."""
        start = rng.normal(0.0, self.start_sd) if rng is not None and self.start_sd else 0.0  # one per start
        meas = {}
        for b in buckets:
            for c, t in b.points():
                true = self.truth.rates[(key, b.name, float(t))]
                meas[b.measurement_key(c, t)] = _bench(
                    [true * math.exp(start + rng.normal(0.0, self.truth.round_sd)) if rng is not None else true
                     for _ in range(rounds)])
        return [ResultRow.from_mapping(r) for r in rows_for_trial(
            sweep_id=self.spec.sweep_id, trial_id=trial_id or role, role=role, config=self.configs[key],
            buckets=buckets,
            measurements=meas)]

    def run(self, rng: np.random.Generator, decide_rounds: int, decide_starts: int = 1) -> tuple[Any, bool]:
        """The committed table, and whether a decide phase measured anything: the sweep's own decide phase
        (:func:`tuning.sweep.decide.decide_phase`, its passes and plans), its engines' rounds drawn here."""
        spec = dataclasses.replace(self.spec, decide_rounds=decide_rounds, decide_starts=decide_starts)
        rows = [r for key, role in self.roles.items() for r in self.rows(key, spec.buckets, spec.repeats, role, rng)]
        df = results_frame(rows)
        if not decide_rounds:
            return choose_table(df, spec, provenance_for(spec, df), self.traffic), False
        passes = iter(range(1_000))

        def measure(spec: SweepSpec, plan: Any) -> list[ResultRow]:
            """Fresh engines in alternation, as run_decision measures them; each start its own trial."""
            p = next(passes)
            return [r for start in range(plan.starts) for key in plan.points
                    for r in sweep_rows(self.rows(key, plan.buckets, plan.rounds // plan.starts, ROLE_DECIDE, rng,
                                                  trial_id=f"{ROLE_DECIDE}-{p}-{start}"), spec.buckets)]

        with contextlib.redirect_stderr(io.StringIO()):  # its progress lines, thousands of them here
            all_rows, df, _ = decide_phase(spec, rows, df, measure)
        return choose_table(df, spec, provenance_for(spec, df), self.traffic), len(all_rows) > len(rows)


def truth_frame(sweeper: Sweeper) -> Any:
    """The results a noise-free sweep would have: every config on every cell once, at its true rate."""
    return results_frame([r for key, role in sweeper.roles.items()
                          for r in sweeper.rows(key, sweeper.spec.buckets, 1, role)])


def true_mix(table: Any, spec: SweepSpec, truth_df: Any, traffic: Any) -> float:
    """``table``'s output tok/s on the mix, its parts at the true rates."""
    pred, where = predict_on_mix(table, truth_df, spec.buckets, traffic, spec.constraints)
    if pred is None:
        raise RuntimeError(f"no prediction on the mix: {where}")
    return float(pred.per_bucket_throughput)


def routes(table: Any, spec: SweepSpec) -> tuple[str, ...]:
    """Which config serves each (bucket, band, load) part the sweep measured: what two tables are compared on."""
    labels = {k: c.label() for k, c in table.distinct_configs().items()}
    return tuple(f"{b.name} {band.name}@{level}: "
                 f"{labels[BucketChoice.of_route(table.bucket(b.name)).key_for(band.name, level)]}"
                 for b in spec.buckets for band in table.sampling_bands for level in b.concurrency_levels)


def measure(sweeper: Sweeper, truth_df: Any, reference: float, decide_rounds: int, pairs: int,
            seed: int, decide_starts: int = 1) -> dict[str, Any]:
    """``pairs`` pairs of independent sweeps at ``decide_rounds`` over ``decide_starts`` engine starts per
    config: how often their tables agree on the mix,
    and each table's true throughput on it (scored on ``truth_df``) over ``reference``."""
    spec, traffic = sweeper.spec, sweeper.traffic
    rng = np.random.default_rng(seed)
    cache: dict[tuple[str, ...], float] = {}
    ratios, scores, decided, differ = [], [], 0, 0
    seen_routes: dict[tuple[str, ...], int] = defaultdict(int)
    for i in range(pairs):
        if i and i % 100 == 0:
            print(f"  decide rounds {decide_rounds} over {decide_starts} start(s): {i}/{pairs} pairs", file=sys.stderr,
                  flush=True)
        pair = []
        for _side in range(2):
            table, ran = sweeper.run(rng, decide_rounds, decide_starts)
            decided += ran
            key = routes(table, spec)
            seen_routes[key] += 1
            if key not in cache:
                cache[key] = true_mix(table, spec, truth_df, traffic)
            pair.append((key, cache[key]))
        (ka, a), (kb, b) = pair
        differ += ka != kb
        ratios.append(b / a)
        scores.extend((a, b))
    ratios_a = np.array(ratios)
    to_ref = np.array(scores) / reference
    within = float(np.mean(np.abs(np.log(ratios_a)) <= math.log(1 + TOLERANCE)))
    return {
        "decide_rounds": decide_rounds, "decide_starts": decide_starts, "pairs": pairs, "seed": seed,
        "routes_differ": differ / pairs,
        "within_tolerance": within,
        "within_tolerance_se": math.sqrt(within * (1 - within) / pairs),
        "ratio_p5": float(np.percentile(np.minimum(ratios_a, 1 / ratios_a), 5)),
        "decide_phase_share": decided / (2 * pairs),
        "reference_tok_s": reference,
        "to_reference_mean": float(np.mean(to_ref)),
        "to_reference_p5": float(np.percentile(to_ref, 5)),
        "tables": {" | ".join(k): {"share": n / (2 * pairs), "to_reference": cache[k] / reference}
                   for k, n in sorted(seen_routes.items(), key=lambda kv: -kv[1])},
    }


def render(results: Sequence[Mapping[str, Any]], truth: Truth, start_sd: float, command: str,
           labels: Mapping[str, str]) -> str:
    lines = [
        "# Do two sweeps agree? The sweep's choosing code on drawn measurements (SIMULATED measurements)",
        "",
        f"Command: `{command}` (commit {(git_commit(ROOT) or 'unknown')[:7]}, Python {platform.python_version()}, "
        f"{platform.machine()}).",
        "",
        f"Truth and noise from `{truth.source}`: one round's log sd {truth.round_sd:.3f} "
        f"({math.expm1(truth.round_sd):.1%}); engine-start log sd {start_sd:.3f} ("
        + (f"as the two sweeps show it, {truth.start_df} df: each config started once in each, on four cells"
           if start_sd == truth.start_sd else f"set; the two sweeps show {truth.start_sd:.3f}, {truth.start_df} df")
        + "). Configs, buckets, temperatures, load and rounds per config as that run's sweeps "
        "(`work/sweep-a/sweep.json`); the mix `benchmarks/gpu/payoff_mix_test_ckpt.yaml`. Each table is scored on the "
        "true rates (its parts' time split at will, as the sweep predicts a mix).",
        "",
        "True rates (output tok/s, 64 in flight):",
        "",
        "| config | bucket | T | tok/s |",
        "|---|---|---|---|",
        *(f"| {labels.get(key, key)} | {b} | {t:g} | {r:,.0f} |" for (key, b, t), r in sorted(truth.rates.items())),
        "",
        f"| decide rounds | over starts | pairs | routes differ | within {TOLERANCE:.0%} on the mix | 5th pct of the "
        "pair's ratio | decide phase ran | table / reference, mean (5th pct) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r['decide_rounds']} | {r['decide_starts']} | {r['pairs']} | {r['routes_differ']:.0%} | "
                     f"{r['within_tolerance']:.0%} ± {r['within_tolerance_se']:.0%} | {r['ratio_p5']:.3f} | "
                     f"{r['decide_phase_share']:.0%} of sweeps | {r['to_reference_mean']:.3f} ({r['to_reference_p5']:.3f}) |")
    lines += ["", "Tables committed (share of sweeps; true mix throughput over the reference's, the table a noise-free "
              "sweep commits):", ""]
    for r in results:
        lines.append(f"- decide rounds {r['decide_rounds']} over {r['decide_starts']} start(s):")
        lines += [f"  - {v['share']:.0%}, {v['to_reference']:.3f}: {k}" for k, v in r["tables"].items()]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=400, help="pairs of independent sweeps per setting (default 400)")
    ap.add_argument("--decide-rounds", default="0,2,4,8", help="comma list of --decide-rounds to try (default 0,2,4,8)")
    ap.add_argument("--decide-starts", default="1", help="comma list of --decide-starts to try with each "
                    "--decide-rounds that splits evenly over it (default 1)")
    ap.add_argument("--start-sd", type=float, default=None,
                    help="log sd of one engine start's offset, shared by its rounds (default: as the GPU run's two "
                         "sweeps show it)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1, help="settings measured in parallel processes (default 1)")
    ap.add_argument("--out", type=Path, help="write OUT.json and OUT.md (default: print the tables only)")
    args = ap.parse_args(argv)
    try:
        rounds = [int(x) for x in args.decide_rounds.split(",") if x.strip()]
        starts = [int(x) for x in args.decide_starts.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--decide-rounds {args.decide_rounds!r}, --decide-starts {args.decide_starts!r}: comma lists of "
                 "integers, e.g. 0,2,4 and 1,2")
    if args.pairs < 1 or args.jobs < 1 or any(r < 0 for r in rounds) or not starts or any(k < 1 for k in starts) or (
            args.start_sd is not None and args.start_sd < 0):
        ap.error("--pairs >= 1, --jobs >= 1, --decide-rounds >= 0 each, --decide-starts >= 1 each, --start-sd >= 0")
    settings = [(r, k) for r in rounds for k in starts if (r == 0 and k == min(starts)) or (r and r % k == 0)]
    if not settings:
        ap.error("no --decide-rounds splits evenly over any --decide-starts")
    truth = truth_from_run()
    start_sd = truth.start_sd if args.start_sd is None else args.start_sd
    spec = resumed_spec(RUN / "work" / "sweep-a")
    sweeper = Sweeper(spec, truth, load_mix(MIX), start_sd=start_sd)
    truth_df = truth_frame(sweeper)  # the reference: the table a noise-free sweep commits, on the truth
    reference = true_mix(choose_table(truth_df, spec, provenance_for(spec, truth_df), sweeper.traffic), spec, truth_df,
                         sweeper.traffic)
    t0 = time.monotonic()
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:  # each setting its own seed: order-free
        futures = {pool.submit(measure, sweeper, truth_df, reference, r, args.pairs, args.seed + i, k): (r, k)
                   for i, (r, k) in enumerate(settings)}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            (r, k), got = futures[future], future.result()
            print(f"[{done}/{len(settings)}] decide rounds {r} over {k} start(s): within {TOLERANCE:.0%} in "
                  f"{got['within_tolerance']:.0%} of {args.pairs} pairs ({time.monotonic() - t0:.0f} s in all)",
                  file=sys.stderr, flush=True)
        results = [f.result() for f in futures]
    command = "python -m docs.analyses.repro_power.repro_power " + " ".join(argv if argv is not None else sys.argv[1:])
    text = render(results, truth, start_sd, command.strip(), {k: c.label() for k, c in sweeper.configs.items()})
    print(text)
    if args.out:
        json_path, md_path = (args.out.with_name(args.out.name + ext) for ext in (".json", ".md"))
        json_path.write_text(json.dumps(
            {"command": command.strip(), "truth": {"rates": {"|".join(map(str, k)): v for k, v in truth.rates.items()},
                                                   "round_sd": truth.round_sd, "source": truth.source,
                                                   "start_sd": truth.start_sd, "start_df": truth.start_df},
             "start_sd": start_sd, "results": results}, indent=2))
        md_path.write_text(text)
        print(f"wrote {md_path} and {json_path.name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
