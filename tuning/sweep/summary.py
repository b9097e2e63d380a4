"""The sweep's closing summary: the table it chose, what serving it takes, whether it pays, where
everything went, and the next commands (deploy the table, open the report, open the study)."""
from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any

from orchestrator.table import RoutingTable
from tuning.choose.decision import ROLE_DECIDE
from tuning.results import (
    BUSY_HOST_SHARE,
    STATUS_OK,
    behind_schedule_rows,
    busy_host_rows,
)
from tuning.schedule import schedule_lines
from tuning.sweep.decide import DECIDE_DIR
from tuning.sweep.runner import SweepOutcome
from tuning.sweep.spec import SweepSpec

__all__ = [
    "behind_schedule_line",
    "busy_host_line",
    "mixed_line",
    "next_commands",
    "print_summary",
    "serving_line",
    "shared_gpu_line",
    "traffic_line",
]


def print_summary(outcome: SweepOutcome, *, console: Any = None, traffic: Any = None) -> None:
    """The sweep's summary; ``traffic`` (a :class:`tuning.traffic.TrafficMix`) adds the table against the
    best single config on that mix, over every cell the sweep measured."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    spec = outcome.spec
    tag = "SIMULATED — simulator profile, not a GPU measurement" if spec.simulated else "measured on GPUs"
    df = outcome.results
    trials = df[df["role"] != ROLE_DECIDE] if not df.empty and "role" in df else df  # measured again, noted
    n_trials = trials["trial_id"].nunique() if not trials.empty else 0
    n_failed = trials[trials["status"] != STATUS_OK]["trial_id"].nunique() if not trials.empty else 0
    if outcome.table is not None:
        budget = outcome.table.provenance.gpu_budget
        title = ("Best config per bucket" if budget is None
                 else f"Best config per bucket that fits {budget.gpus} GPU(s){' shared' if budget.share_gpu else ''}")
        t = Table(title=f"{title} ({tag})", title_justify="left")
        for col, just in (("bucket", "left"), ("best config", "left"), ("output tok/s", "right"),
                          ("accept len", "right"), ("vs MTP off", "right"), ("vs static", "right")):
            t.add_column(col, justify=just, no_wrap=col == "best config")  # type: ignore[arg-type]
        for r in summary_rows(outcome.table):
            t.add_row(r["bucket"], r["config"] + ("".join(f"\n  {c}" for c in r["cells"])),
                      f"{r['output_throughput']:,.0f}",
                      f"{r['accept_length']:.2f}" if r["accept_length"] else "-",
                      _pct(r["gain_vs_mtp_off"]), _pct(r["gain_vs_static"]))
        console.print(t)
        console.print(serving_line(outcome.table, spec))
        if traffic is not None:  # the user's mix supersedes "each bucket's workload once"
            console.print(traffic_line(outcome.table, df, spec, traffic))
        elif mixed := mixed_line(outcome.table, df):
            console.print(mixed)
        for line in schedule_lines(outcome.table):
            console.print(f"vLLM draft schedule, {line}", markup=False, highlight=False, soft_wrap=True)
        for note in (*outcome.table.provenance.notes, *(budget.notes if budget else ())):
            console.print(f"  - {note}")
        if outcome.error:
            console.print(f"[bold red]Routing table not committed everywhere[/]:\n{outcome.error}")
    else:
        console.print(f"[bold red]No routing table written[/] ({tag}):\n{outcome.error}")
    for warning in (busy_host_line(df), behind_schedule_line(df)):
        if warning:
            console.print(f"[yellow]{warning}[/]")
    console.print(f"{n_trials} trials ({n_failed} failed) in {outcome.wall_s:.0f} s; sweep id {spec.sweep_id}")
    console.print(f"results:        {outcome.results_paths[0]}\n                {outcome.results_paths[1]}")
    if outcome.table_path is not None:
        console.print(f"routing table:  {outcome.table_path} (version {outcome.table.version})")
    console.print(f"engine logs:    {Path(spec.run_dir) / 'engine-logs'}")
    if (Path(spec.run_dir) / DECIDE_DIR / "engine-logs").is_dir():  # the undecided cells measured again
        console.print(f"                {Path(spec.run_dir) / DECIDE_DIR / 'engine-logs'}")
    console.print("next:")
    for what, command in next_commands(outcome):
        console.print(f"  {what:<15} {command}", markup=False, highlight=False, soft_wrap=True)


def next_commands(outcome: SweepOutcome) -> list[tuple[str, str]]:
    """What to run after this sweep, as ``(what, shell command)``: serve the committed table (only when
    one was committed), read the report, browse the Optuna study."""
    spec = outcome.spec
    run_dir = Path(spec.run_dir)
    out: list[tuple[str, str]] = []
    if outcome.table_path is not None and outcome.table is not None:
        deploy = ["python", "-m", "orchestrator.deploy", "--routing-table", str(outcome.table_path)]
        if spec.simulated and spec.sim_time_scale:
            deploy += ["--sim-time-scale", f"{spec.sim_time_scale:g}"]
        if spec.share_gpu:
            deploy.append("--share-gpu")
        out.append(("deploy table:", shlex.join(deploy)))
    out.append(("open report:", shlex.join(["python", "-m", "tuning.report", str(run_dir)])))
    out.append(("open study:", shlex.join(["optuna-dashboard", f"sqlite:///{run_dir.resolve() / 'optuna.db'}"])))
    return out


def serving_line(table: RoutingTable, spec: SweepSpec) -> str:
    """How many GPUs serving ``table`` takes (one replica per engine), whole and shared, so a table the
    deploy target cannot hold shows before ``orchestrator.deploy`` refuses it; with a GPU budget, the
    replicas planned on it."""
    n = len(table.distinct_configs())
    budget = table.provenance.gpu_budget
    if budget is not None and budget.replicas:
        configs = table.distinct_configs()
        per = ", ".join(f"{configs[k].label()} x{r}" for k, r in budget.replicas.items())
        line = (f"serving:        {sum(budget.replicas.values())} {'simulated ' if spec.simulated else ''}replica(s) "
                f"of {n} engine(s) on --serve-gpus {budget.gpus}{' --share-gpu' if budget.share_gpu else ''}: {per} "
                "(deploy uses these replicas unless its scaling says otherwise)")
        return line + (f"\n{shared_gpu_line(table)}" if budget.shared else "")
    if spec.simulated:
        return f"serving:        {n} simulated engine(s), no GPU"
    shareable = any(c.tp == 1 for c in table.distinct_configs().values())
    line = (f"serving:        {n} engine(s), one replica each, need {table.gpus_needed(share_gpu=False)} GPU(s)"
            + (f"; {table.gpus_needed(share_gpu=True)} with --share-gpu" if shareable else ""))
    if spec.serve_gpus is not None:
        line += f" (chosen to fit --serve-gpus {spec.serve_gpus}{' --share-gpu' if spec.share_gpu else ''})"
    return line


def shared_gpu_line(table: RoutingTable) -> str | None:
    """Which engines share which GPU under the table's plan (``gpu_budget.shared``: one replica of each on
    every GPU of the budget, time-sliced), with the share of a GPU each reserves; ``None`` when none do."""
    budget = table.provenance.gpu_budget
    if budget is None or not budget.shared:
        return None
    configs = table.distinct_configs()
    engines = " + ".join(f"{configs[k].label()} ({configs[k].gpu_request(share_gpu=True):g} GPU reserved)"
                         if not configs[k].simulated else configs[k].label() for k in budget.shared)
    gpus = "GPU 0" if budget.gpus == 1 else f"each of GPUs 0-{budget.gpus - 1}"
    return f"shared GPU:     {gpus} time-shared by {engines}"


def mixed_line(table: RoutingTable, results: Any) -> str | None:
    """The table against the best single config on the buckets in proportion, predicted from this
    sweep's figures (:mod:`tuning.choose.mix`): whether serving several configs pays at all."""
    from tuning.choose.mix import predict_for_table

    pred = predict_for_table(table, results)
    if pred is None:
        return None
    key, single = pred.best_single
    label = results.loc[results["engine_key"] == key, "engine_label"].iloc[0]
    return (f"mixed workload: {pred.per_bucket_throughput:,.0f} tok/s with this table vs {single:,.0f} with the best "
            f"single config ({label}) everywhere: {pred.ratio:.2f}x (each bucket's workload once; predicted from "
            "these figures, not measured)")


def traffic_line(table: RoutingTable, results: Any, spec: SweepSpec, traffic: Any) -> str:
    """The table (its primaries and cells) against every single config on the user's traffic mix, over
    every load level the sweep measured (in equal shares of the tokens) or at the buckets' primary load,
    predicted from this sweep's figures (:func:`tuning.choose.prediction.predict_on_mix`), with the engines'
    time split between parts at will. A table of several configs with no serving plan (no
    ``--serve-gpus``) is deployed one engine per config, so that case is predicted too
    (:func:`tuning.choose.prediction.predict_on_engines`): with whole engines one config may carry most of
    the mix, and the table can lose what its routing gains."""
    from tuning.choose.prediction import predict_on_engines, predict_on_mix

    pred, where = predict_on_mix(table, results, spec.buckets, traffic)
    if pred is None:
        return f"traffic mix: not predicted: {where}"
    if pred.best_single is None:
        return (f"traffic mix: {pred.per_bucket_throughput:,.0f} tok/s with this table; no single config was measured on "
                "every cell of the mix")
    key, single = pred.best_single
    line = (f"traffic mix: {pred.per_bucket_throughput:,.0f} tok/s with this table vs {single:,.0f} with the best single "
            f"config ({key}) everywhere: {pred.ratio:.2f}x (the mix's tokens per bucket and sampling band, {where}, the "
            "engines' time split between them at will; predicted from these figures, not measured)")
    n = len(table.distinct_configs())
    if n > 1 and table.provenance.gpu_budget is None:
        engines, _ = predict_on_engines(table, results, spec.buckets, traffic)
        if engines is not None and engines.single is not None:
            line += (f"\n  on {n} engines, one per config (how it deploys without --serve-gpus): "
                     f"{engines.throughput:,.0f} tok/s vs {engines.single[1]:,.0f} with {engines.single[0]} on as many: "
                     f"{engines.ratio:.2f}x; --serve-gpus N sizes whole replicas for N GPUs")
    return line


def _flagged(rows: Any, results: Any) -> tuple[int, str]:
    """How many measurements ``results`` holds, and the labels of the configs among ``rows``."""
    return int(results["status"].eq(STATUS_OK).sum()), ", ".join(sorted(rows["engine_label"].astype(str).unique()))


def busy_host_line(results: Any) -> str | None:
    """A warning when real engines were measured on a host whose CPUs were busy (see
    :data:`tuning.results.BUSY_HOST_SHARE`): which configs, so they can be measured again on a quiet host."""
    busy = busy_host_rows(results)
    if busy.empty:
        return None
    measured, labels = _flagged(busy, results)
    return (f"host busy: {len(busy)} of {measured} measurements ran with the host's CPUs at least "
            f"{BUSY_HOST_SHARE:.0%} busy (up to {busy['host_cpu_busy_max'].max():.0%}; the column host_cpu_busy_max): "
            f"{labels}. A busy host slows a launch-bound engine by as much as configs differ; measure them again "
            "with the host quiet before trusting their ranking")


def behind_schedule_line(results: Any) -> str | None:
    """A warning when simulated engines fell behind their schedule while measured (see
    :func:`tuning.results.behind_schedule_rows`): which configs, and what to change."""
    from tuning.drive.summary import MAX_LAG_SHARE

    late = behind_schedule_rows(results)
    if late.empty:
        return None
    measured, labels = _flagged(late, results)
    return (f"behind schedule: {len(late)} of {measured} simulated measurements, measured again, still ran their "
            f"engine more than {MAX_LAG_SHARE:.0%} of the run behind its schedule (up to "
            f"{late['sim_lag_share_max'].max():.1%}; the column sim_lag_share_max): {labels}. Their figures rank "
            "this host's load as much as the configs; measure again with a lower --sim-time-scale or fewer "
            "--max-concurrent-trials")


def _pct(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 100:+.1f}%"


def summary_rows(table: RoutingTable) -> list[dict[str, Any]]:
    """Per bucket: label of the chosen config, throughput, gains (for the CLI's summary table)."""
    out = []
    for b in table.buckets:
        cfg = b.engine_config()
        out.append({
            "bucket": b.name, "config": cfg.label(), "output_throughput": b.figures.output_throughput,
            "accept_length": b.figures.accept_length,
            "gain_vs_mtp_off": b.gains.get("mtp_off"), "gain_vs_static": b.gains.get("static"),
            "cells": [f"{c.sampling or 'any'} >={c.min_in_flight}: {c.engine_config().label()}" for c in b.cells],
        })
    return out
