"""``python -m tuning.sweep``: search engine configs per output-length bucket with Ray Tune + Optuna,
measure the baselines under the same workloads, and commit a routing table.

Without arguments it sweeps the simulated engine (calibrated profile
:data:`orchestrator.sim.model.DEFAULT_PROFILE`) on a local Ray; every figure is labelled SIMULATED.
``--model PATH`` sweeps LMDeploy on the GPUs of the Ray cluster (``--address`` to join one).

Objective (``--objective``). The default is ``scalar``: the mean over buckets of ``log(output
throughput)``, which ranks trials exactly like the mean of ``log(throughput / MTP-off baseline)`` (the
baseline is a per-bucket constant), so it needs no baseline at trial time. The routing table takes
each bucket's best from *all* measured trials whichever objective guided the search; the objective
only decides where TPE looks next. ``docs/analyses/optuna_vs_grid/optuna_vs_grid.py`` compares both on the simulator:
multi-objective TPE spreads its trials along a Pareto front of four highly correlated objectives,
while the scalar concentrates TPE on the draft axis that separates the buckets, and reaches every
bucket's best in fewer configs. So ``scalar`` is the default; ``multi`` is available.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.errors import OrchestratorError
from orchestrator.sim.model import DEFAULT_PROFILE
from tuning.sweep.budget import BUDGET_FILE, read_budget
from tuning.sweep.spec import (
    GPU_BURN_IN_S,
    GPU_ROUNDS,
    GPU_WARMUP_REQUESTS,
    SweepError,
    build_spec,
    load_defaults,
    resumed_spec,
    short_measurement_warnings,
)

__all__ = ["main", "parser", "traffic_from_args"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tuning.sweep",
        description="Search LMDeploy MTP engine configs per output-length bucket (Ray Tune + Optuna TPE), "
                    "measure the MTP-off and static-recommendation baselines under the same workloads, and "
                    "commit a routing table. With no arguments: a SIMULATED sweep of the calibrated profile "
                    f"{DEFAULT_PROFILE} on a local Ray (no GPU; its time on 2 cores: docs/results.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("engine")
    g.add_argument("--model", help="checkpoint path or hub id: sweep LMDeploy on GPUs (omit for the simulator)")
    g.add_argument("--sim-profile", help=f"simulator profile name or JSON path (no --model); default {DEFAULT_PROFILE}")
    g.add_argument("--sim-time-scale", type=float, help="simulator speed-up (figures stay in simulated time); "
                   "default from defaults.yaml")
    g.add_argument("--tp", type=int, help="tensor-parallel degree = GPUs per trial (default 8)")
    g.add_argument("--session-len", type=int, help="--session-len for every engine")
    g.add_argument("--tokenizer", help="tokenizer path for LMDeploy workloads (default: --model)")
    s = p.add_argument_group("search space (narrow/widen the defaults)")
    s.add_argument("--space", help="YAML file with knobs: speculative, num_draft_tokens, memory_fraction, "
                   "max_batch_size, off_backends, spec_backends (lists, or {low, high, step})")
    s.add_argument("--speculative", type=lambda v: [x.strip() for x in v.split(",")],
                   help="MTP switch values, e.g. 'true' or 'false,true'")
    s.add_argument("--num-draft-tokens", type=_int_list, help="LMDeploy draft tokens, e.g. 1,2,3,4 "
                   "(sglang steps=k / draft tokens=k+1 is LMDeploy k)")
    s.add_argument("--memory-fraction", type=_float_list, help="--cache-max-entry-count values, e.g. 0.7,0.8,0.9")
    s.add_argument("--baseline-memory-fraction", type=float, metavar="F",
                   help="the baselines' (MTP off, MTP-4) --cache-max-entry-count (default 0.8, LMDeploy's); with "
                        "--share-gpu a small value lets their engines, and a decide phase's fresh ones, start side "
                        "by side")
    s.add_argument("--max-batch-size", type=_int_list, help="--max-batch-size values, e.g. 64,128,256")
    s.add_argument("--backends", type=lambda v: v.split(","),
                   help=f"engines tried with MTP off, of {', '.join(_engines())} (e.g. pytorch,turbomind,vllm)")
    s.add_argument("--spec-backends", type=lambda v: v.split(","),
                   help=f"engines tried with MTP on, of {', '.join(_engines(speculating=True))} (default pytorch; "
                        "pytorch,vllm measures both engine families and the table may mix them). Without --model "
                        "the simulator stands in for each")
    w = p.add_argument_group("workloads")
    w.add_argument("--buckets", help="output-length bucket bounds, e.g. 1024,4096,8192,16384")
    w.add_argument("--concurrency", help="concurrency levels per bucket, primary first, e.g. 64,128")
    w.add_argument("--temperatures", type=_float_list,
                   help="sampling temperatures per bucket, primary first, e.g. 0,0.8: with more than one, every "
                        "(temperature band, concurrency) may get its own config in the table (cells), where it beats "
                        "the bucket's primary beyond the noise")
    mix = w.add_mutually_exclusive_group()
    mix.add_argument("--traffic-mix", metavar="FILE", help="a traffic mix (YAML/JSON: classes of max_tokens, "
                     "temperature, share): the summary predicts the table against the best single config on it")
    mix.add_argument("--request-log", metavar="FILE", help="a request log (one OpenAI request body per line) whose "
                     "max_tokens/temperature shares are the traffic mix, as --traffic-mix")
    w.add_argument("--num-prompts", type=int, help="prompts per bucket (default per bucket from defaults.yaml)")
    w.add_argument("--dataset", choices=["random", "sharegpt"], help="dataset (default random)")
    w.add_argument("--dataset-path", help="ShareGPT JSON for --dataset sharegpt")
    w.add_argument("--warmup-requests", type=int, help="requests sent to each bucket's engine before measuring, "
                   f"not counted (default {GPU_WARMUP_REQUESTS} with --model: a fresh LMDeploy engine's first batches "
                   "pay one-time kernel set-up; 0 on the simulator)")
    w.add_argument("--no-burn-in", action="store_true",
                   help="with --model, do not run the first bucket once unmeasured before measuring (a fresh "
                        "LMDeploy engine's first full-load run is slower than the ones after it)")
    w.add_argument("--burn-in-s", type=float, metavar="S",
                   help=f"with --model, repeat the burn-in run until it has lasted S seconds (default {GPU_BURN_IN_S:g}: "
                        "a fresh engine can keep speeding up past its first full-length wave)")
    w.add_argument("--repeats", type=int, metavar="R", help="rounds of every bucket on the same engine (default "
                   f"{GPU_ROUNDS} with --model, 1 on the simulator); "
                   "the lower-median run counts, every run's throughput and their spread go to results.csv, and "
                   "a config is preferred over another only when their intervals over the rounds part; with "
                   "--share-gpu the rounds of co-resident configs take turns on the GPU")
    w.add_argument("--decide-rounds", type=int, metavar="R",
                   help="before committing, measure every cell comparison left within noise again: both configs "
                        "on fresh engines (--decide-starts), R rounds of those cells, pooled with the first "
                        "(default 0: none; two rounds per config can miss a gap of 15-20 %%, so two sweeps may "
                        "route such a cell differently; 16 over 8 starts brought two simulated sweeps of an H200 "
                        "space within 3 %% on the mix in 95 %% of pairs, on one start below 50 %% however many "
                        "rounds: docs/analyses/repro_power/repro_power_2026-12-05.md)")
    w.add_argument("--decide-starts", type=int, metavar="K",
                   help="split --decide-rounds over K fresh engines per config, started in alternation, so the "
                        "comparison holds the variation between engine starts (default 1; R must be a multiple of K)")
    w.add_argument("--no-early-stop", action="store_true", help="run every request to completion (no "
                   "steady-state early stop)")
    r = p.add_argument_group("search and budgets")
    r.add_argument("--num-trials", type=int, help="trials in total, baselines included (default from defaults.yaml)")
    r.add_argument("--time-budget-s", type=float, help="no new trial starts after this many seconds (running "
                   "trials finish)")
    r.add_argument("--stop-after-s", type=float, help="no round of any engine starts after this many seconds: "
                   "engines stop where they are and the table is chosen from the rounds measured (for a caller "
                   "with a deadline of its own; at least --time-budget-s)")
    r.add_argument("--objective", choices=["scalar", "multi"], help="scalar: mean log throughput over buckets; "
                   "multi: one objective per bucket (multi-objective TPE)")
    r.add_argument("--seed", type=int, help="TPE seed")
    r.add_argument("--max-concurrent-trials", type=int, help="parallel trials (default: cluster GPUs // tp; "
                   "simulator: up to 2 per the CPUs)")
    r.add_argument("--share-gpu", action="store_true", help="tp=1 engines share a GPU while their memory "
                   "fractions fit (each reserves fraction + 0.1 of it); they start side by side but are measured "
                   "one at a time per GPU. For models far smaller than the GPU (test checkpoints)")
    r.add_argument("--serve-gpus", type=int, metavar="N", help="the committed table must be servable on N GPUs "
                   "(one replica per engine; with --share-gpu tp=1 engines reserve fraction + 0.1 each): the best "
                   "config per bucket if that fits, else the fitting mix of each bucket's top configs with the best "
                   "mean log throughput; then the N GPUs are filled with whole replicas sized by each config's share of "
                   "the traffic's work (--traffic-mix, else the buckets in proportion), and a cell that does not pay for "
                   "the replicas it takes gives way. Default: no limit (the summary says how many GPUs the table needs)")
    r.add_argument("--max-tpot-ms", type=float, help="a bucket's chosen config must have median TPOT <= this")
    r.add_argument("--max-ttft-ms", type=float, help="a bucket's chosen config must have median TTFT <= this")
    o = p.add_argument_group("where")
    o.add_argument("--run-dir", help="folder for everything (default runs/<sweep id>/)")
    o.add_argument("--sweep-id", help="sweep id (default sweep-<date>-<random>)")
    o.add_argument("--routing-table", help="commit the routing table here too (default <run-dir>/routing_table.json)")
    o.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted sweep in RUN_DIR (same study, "
                   "no finished trial re-run); --num-trials / --time-budget-s set the new budget")
    o.add_argument("--address", help="join this Ray cluster (e.g. 'auto' or ray://host:10001) instead of a local Ray")
    o.add_argument("--num-cpus", type=int, help="CPUs for the local Ray (default: all)")
    o.add_argument("--no-live", action="store_true", help="no live progress display")
    return p


def _int_list(v: str) -> list[int]:
    return [int(x) for x in v.split(",") if x.strip()]


def _engines(*, speculating: bool = False) -> list[str]:
    """The registered real engines (:mod:`orchestrator.backends`), for the help text."""
    from orchestrator.backends import get_backend, known_backends

    return [b for b in known_backends(simulatable=True) if not speculating or get_backend(b).supports_speculation]


def _float_list(v: str) -> list[float]:
    return [float(x) for x in v.split(",") if x.strip()]


def traffic_from_args(args: argparse.Namespace) -> Any:
    """The traffic mix of ``--traffic-mix`` or ``--request-log`` (``None`` without either)."""
    from orchestrator.config import API_DEFAULT_TEMPERATURE, Backend
    from tuning.traffic import TrafficError, load_mix, mix_from_request_log

    if args.traffic_mix:
        return load_mix(args.traffic_mix)
    if not args.request_log:
        return None
    try:
        with open(args.request_log, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as e:
        raise TrafficError(f"cannot read request log {args.request_log}: {e}") from None
    first_bound = int(args.buckets.split(",")[0]) if args.buckets else 1024  # the table's default_max_tokens
    return mix_from_request_log(lines, default_max_tokens=first_bound,
                                default_temperature=API_DEFAULT_TEMPERATURE[Backend.PYTORCH if args.model else Backend.SIM])


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        traffic = traffic_from_args(args)  # before anything starts: a bad file costs no sweep
    except OrchestratorError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import ray

    defaults = load_defaults()
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "0")
    if not ray.is_initialized():
        if args.address:
            ray.init(address=args.address, log_to_driver=False)
        else:
            ray.init(address="local", num_cpus=args.num_cpus or os.cpu_count() or 2, include_dashboard=False, log_to_driver=False,
                     configure_logging=True, logging_level=logging.WARNING)
    cluster = ray.cluster_resources()
    try:
        if args.resume:
            spec = resumed_spec(args.resume, serve_gpus=args.serve_gpus)
            budget = read_budget(Path(args.resume) / BUDGET_FILE)
            num_trials = args.num_trials or budget.get("num_trials")
            resume = True
        else:
            spec = build_spec(args, defaults, cluster_gpus=int(cluster.get("GPU", 0)),
                              cluster_cpus=int(cluster.get("CPU", 2)))
            sweep_cfg = {**defaults.get("sweep", {}), **(defaults.get("sim", {}).get("sweep", {}) if not args.model else {})}
            num_trials = args.num_trials or int(sweep_cfg.get("num_trials", 40))
            resume = False
        if not spec.simulated and int(cluster.get("GPU", 0)) < spec.space.tp:
            raise SweepError(f"the Ray cluster has {int(cluster.get('GPU', 0))} GPUs but a trial needs tp={spec.space.tp}; "
                             "join a GPU cluster with --address, lower --tp, or omit --model for the simulator")
        from rich.console import Console

        console = Console()
        label = "[bold yellow]SIMULATED[/] " if spec.simulated else ""
        console.print(f"{label}sweep {spec.sweep_id}: {spec.space.size()} distinct configs, "
                      f"{len(spec.buckets)} buckets, budget {num_trials} trials, "
                      f"{spec.max_concurrent_trials} in parallel; run dir {spec.run_dir}")
        for note in short_measurement_warnings(spec):
            console.print(f"[yellow]warning:[/] {note}")
        from tuning.sweep.runner import run_sweep
        from tuning.sweep.summary import print_summary

        outcome = run_sweep(spec, num_trials=num_trials, time_budget_s=args.time_budget_s, resume=resume,
                            live=not args.no_live, commit_to=(), traffic=traffic, stop_after_s=args.stop_after_s)
        print_summary(outcome, console=console, traffic=traffic)
        # A table that could not be committed everywhere it was asked for (e.g. the serving path)
        # is a failed sweep too: the caller must not go on to deploy from that path.
        return 0 if outcome.table is not None and outcome.error is None else 3
    except (OrchestratorError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the run dir (or a file in it) can't be written: say which, no traceback
        print(f"error: cannot write the sweep's files: {e}; choose a writable --run-dir with free space",
              file=sys.stderr)
        return 2
