"""``python -m tuning.report RUN_DIR``: figures and one HTML page from a sweep's run dir.

Reads ``results.parquet`` (or ``results.csv``) and, when present, ``routing_table.json`` from a run
dir written by ``python -m tuning.sweep`` and writes, under ``--out`` (default ``RUN_DIR/report``):

- ``throughput_vs_length.png`` -- output throughput vs bucket output length, one line per config
  (the best few and both baselines highlighted, the rest grey);
- ``gain_vs_published.png`` -- MTP gain per bucket (chosen config vs the MTP-off baseline) next to
  the published Intern-S2-Preview 8xH200 table (:data:`PUBLISHED`);
- ``accept_length.png`` -- measured accept length vs output length, one line per draft-token count,
  with the published accept lengths;
- ``tpot_vs_throughput.png`` -- median TPOT vs output throughput per bucket, Pareto front drawn;
- ``report.html`` -- the four images (embedded, so the page is one self-contained file), the routing
  table, failed trials with their reasons, and a SIMULATED banner when the figures are simulated.

The module is split like the rest of the tuner: pure functions take a results DataFrame (and an
optional :class:`~orchestrator.table.RoutingTable`) and return data frames or matplotlib figures
(:func:`throughput_by_length`, :func:`gain_table`, :func:`accept_length_table`,
:func:`pareto_front`, :func:`routing_summary`, :func:`failed_trials`, and a ``plot_*`` function for
each); :func:`load_run` and :func:`write_report` are the only functions that touch files. The
notebook ``notebooks/sweep_analysis.ipynb`` calls the same functions.
"""
from __future__ import annotations

import argparse
import base64
import html
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from orchestrator import table as routing
from orchestrator.errors import OrchestratorError
from orchestrator.table import RoutingTable, RoutingTableError
from tuning.results import STATUS_FAILED, successful_primary_rows
from tuning.sweep.space import BASELINE_ROLES, ROLE_MTP_OFF, ROLE_STATIC

if TYPE_CHECKING:  # matplotlib is imported lazily; figures are built without pyplot, so no GUI backend
    from matplotlib.figure import Figure

__all__ = [
    "FIGURE_FILES",
    "PUBLISHED",
    "NoResultsError",
    "PublishedPoint",
    "ReportError",
    "SweepRun",
    "accept_length_table",
    "build_figures",
    "failed_trials",
    "find_latest_run",
    "gain_table",
    "is_simulated",
    "load_run",
    "main",
    "normalise",
    "pareto_front",
    "plot_accept_length",
    "plot_gain_vs_published",
    "plot_throughput_vs_length",
    "plot_tpot_vs_throughput",
    "render_html",
    "routing_summary",
    "throughput_by_length",
    "write_report",
]

RESULTS_PARQUET = "results.parquet"
RESULTS_CSV = "results.csv"
ROUTING_TABLE = "routing_table.json"

FIGURE_FILES = {
    "throughput": "throughput_vs_length.png",
    "gain": "gain_vs_published.png",
    "accept": "accept_length.png",
    "pareto": "tpot_vs_throughput.png",
}
ROLE_LABELS = {ROLE_MTP_OFF: "MTP off (baseline)", ROLE_STATIC: "static MTP recommendation (baseline)"}


@dataclass(frozen=True)
class PublishedPoint:
    """One row of the published table: Intern-S2-Preview on 8xH200, concurrency 64, temperature 0,
    random dataset (input 1024), MTP (static recommendation) vs MTP off."""

    output_len: int
    gain: float  # relative output-throughput gain of MTP on over MTP off, 0.1568 = +15.68%
    accept_length: float


PUBLISHED: tuple[PublishedPoint, ...] = (
    PublishedPoint(1024, 0.1568, 2.97),
    PublishedPoint(4096, 0.5132, 3.14),
    PublishedPoint(8192, 0.7597, 3.39),
    PublishedPoint(16000, 0.9752, 3.63),
)
PUBLISHED_SOURCE = "published: Intern-S2-Preview, 8xH200, concurrency 64, temperature 0"
_PUBLISHED_TOLERANCE = 0.05  # a bucket bound within 5% of a published output length matches it (16384 ~ 16000)


class ReportError(OrchestratorError):
    """The report can't be made (e.g. unreadable results); the message says what to do."""


class NoResultsError(ReportError):
    """The run dir holds no results table (or an empty one)."""


@dataclass
class SweepRun:
    """What a report is made from: the results table, the routing table if one was committed."""

    run_dir: Path | None
    results: pd.DataFrame
    table: RoutingTable | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def simulated(self) -> bool:
        return is_simulated(self.results, self.table)

    @property
    def sweep_id(self) -> str:
        if self.table is not None:
            return self.table.provenance.sweep_id
        ids = self.results["sweep_id"].dropna().unique() if "sweep_id" in self.results else []
        return str(ids[0]) if len(ids) else (self.run_dir.name if self.run_dir else "sweep")


# ----- I/O ------------------------------------------------------------------------------------------------
def find_latest_run(runs_dir: str | Path = "runs") -> Path:
    """The newest run dir (by modification time) under ``runs_dir`` that holds a results table."""
    root = Path(runs_dir)
    candidates = [p for p in root.glob("*") if p.is_dir()
                  and ((p / RESULTS_PARQUET).exists() or (p / RESULTS_CSV).exists())] if root.is_dir() else []
    if not candidates:
        raise NoResultsError(f"no run dir with {RESULTS_PARQUET} under {root.resolve()}; run `python -m tuning.sweep` "
                             "first, or give the run dir explicitly (SWEEP_RUN_DIR for the notebook)")
    return max(candidates, key=lambda p: max(f.stat().st_mtime for f in p.glob("results.*")))


def load_run(run_dir: str | Path) -> SweepRun:
    """Read a run dir's results (parquet, else csv) and its routing table if there is a valid one.

    Raises :class:`NoResultsError` when there is no results table or it has no rows.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise NoResultsError(f"{run_dir} is not a directory; give the run dir written by `python -m tuning.sweep`")
    pq, csv = run_dir / RESULTS_PARQUET, run_dir / RESULTS_CSV
    try:
        if pq.exists():
            df = pd.read_parquet(pq)
        elif csv.exists():
            df = pd.read_csv(csv)
        else:
            raise NoResultsError(
                f"{run_dir} has no {RESULTS_PARQUET} or {RESULTS_CSV}: give the run dir that `python -m tuning.sweep` "
                "wrote (runs/sweep-<date>-<id>/); a sweep writes its results after its first trial finishes")
    except NoResultsError:
        raise
    except Exception as e:  # noqa: BLE001 -- any reader error becomes one message
        raise ReportError(f"cannot read the results in {run_dir}: {e}") from None
    if df.empty:
        raise NoResultsError(f"the results table in {run_dir} has no rows yet; wait for a trial to finish")
    notes = []
    table = None
    if (run_dir / ROUTING_TABLE).exists():
        try:
            table = routing.load(run_dir / ROUTING_TABLE)
        except RoutingTableError as e:
            notes.append(f"routing table not shown: {e}")
    else:
        notes.append(f"no {ROUTING_TABLE} in the run dir (the sweep is incomplete or still running); "
                     "chosen configs below are the best measured rows, without the sweep's constraints")
    return SweepRun(run_dir=run_dir, results=normalise(df), table=table, notes=notes)


# ----- data (pure) ----------------------------------------------------------------------------------------
def _truthy(v: Any) -> bool:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return False
    if isinstance(v, str):
        return v.strip().lower() in ("true", "1", "yes")
    return bool(v)


def normalise(df: pd.DataFrame) -> pd.DataFrame:
    """Types as the report expects them, whatever the reader (CSV stringifies booleans, parquet may
    stringify mixed columns): numbers numeric, flags boolean, labels strings."""
    out = df.copy()
    for col in ("max_output_len", "concurrency", "num_draft_tokens", "tp", "output_throughput", "tpot_ms_median",
                "ttft_ms_median", "accept_length", "memory_fraction", "max_batch_size", "request_throughput"):
        if col in out:
            out[col] = pd.to_numeric(out[col], errors="coerce")
    for col in ("primary_load", "speculative", "simulated", "cached"):
        if col in out:
            out[col] = out[col].map(_truthy)
    for col in ("status", "role", "bucket", "engine_label", "engine_key", "failure_reason", "trial_id"):
        if col in out:
            out[col] = out[col].map(lambda v: "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))
    if "primary_load" in out and not out["primary_load"].any() and "concurrency" in out:
        # Older tables without the flag: the lowest concurrency of each bucket is its primary load.
        out["primary_load"] = out["concurrency"] == out.groupby("bucket")["concurrency"].transform("min")
    return out


def is_simulated(results: pd.DataFrame, table: RoutingTable | None = None) -> bool:
    """True when any figure came from the simulator (results' ``simulated`` flag, a ``sim`` backend,
    or the routing table's provenance)."""
    if table is not None and table.provenance.simulated:
        return True
    if "simulated" in results and results["simulated"].map(_truthy).any():
        return True
    return "backend" in results and bool((results["backend"].astype(str) == "sim").any())


def _display_label(role: str, engine_label: str) -> str:
    return f"{ROLE_LABELS[role]}: {engine_label}" if role in ROLE_LABELS else engine_label


def _configs(ok: pd.DataFrame) -> pd.DataFrame:
    """One row per engine_key: its label, the role it is shown with (a baseline role wins), its draft count."""
    def role_of(roles: pd.Series) -> str:
        for r in (ROLE_MTP_OFF, ROLE_STATIC):
            if (roles == r).any():
                return r
        return str(roles.iloc[0])

    g = ok.groupby("engine_key", sort=False)
    cfg = pd.DataFrame({"engine_label": g["engine_label"].first(), "role": g["role"].agg(role_of),
                        "num_draft_tokens": g["num_draft_tokens"].first()})
    cfg["label"] = [_display_label(r, lab) for r, lab in zip(cfg["role"], cfg["engine_label"])]
    return cfg


def throughput_by_length(results: pd.DataFrame, *, top: int = 3) -> pd.DataFrame:
    """Output throughput at each bucket's primary load: one row per config (engine_key) and bucket.

    Columns: engine_key, label, role, max_output_len, bucket, output_throughput, highlight. Duplicate
    measurements of one config (cached trials) are averaged. ``highlight`` marks the ``top`` configs
    by mean log-throughput over the buckets they were measured on (ties: more buckets first) and both
    baselines.
    """
    ok = successful_primary_rows(results)
    if ok.empty:
        return pd.DataFrame(columns=["engine_key", "label", "role", "max_output_len", "bucket",
                                     "output_throughput", "highlight"])
    cfg = _configs(ok)
    agg = (ok.groupby(["engine_key", "bucket", "max_output_len"], as_index=False)["output_throughput"].mean()
           .sort_values(["engine_key", "max_output_len"]))
    agg = agg.join(cfg[["label", "role"]], on="engine_key")
    score = agg.assign(logt=np.log(agg["output_throughput"].clip(lower=1e-9))).groupby("engine_key").agg(
        n=("logt", "size"), mean_log=("logt", "mean"))
    searched = score[~score.index.map(lambda k: cfg.loc[k, "role"] in BASELINE_ROLES)]
    best = searched.sort_values(["n", "mean_log"], ascending=[False, False]).head(top).index
    agg["highlight"] = agg["engine_key"].isin(best) | agg["role"].isin(list(BASELINE_ROLES))
    return agg[["engine_key", "label", "role", "max_output_len", "bucket", "output_throughput", "highlight"]] \
        .reset_index(drop=True)


def _published_for(output_len: float) -> PublishedPoint | None:
    for p in PUBLISHED:
        if abs(output_len - p.output_len) <= _PUBLISHED_TOLERANCE * p.output_len:
            return p
    return None


def _best_rows(ok: pd.DataFrame) -> pd.DataFrame:
    """Per bucket the highest-throughput row (ties: fewer drafts, lower memory fraction), like pick_best."""
    ordered = ok.sort_values(["output_throughput", "num_draft_tokens", "memory_fraction"],
                             ascending=[False, True, True], kind="mergesort")
    return ordered.groupby("bucket", sort=False).head(1).set_index("bucket")


def gain_table(results: pd.DataFrame, table: RoutingTable | None = None) -> pd.DataFrame:
    """Per bucket: the chosen config's gain over the MTP-off baseline (and over the static
    recommendation) next to the published gain and accept length for that output length.

    The chosen config and gains come from the routing table when there is one (the constraints the
    sweep applied included); otherwise from the best successful row at the bucket's primary load.
    Columns: bucket, max_output_len, chosen, concurrency (of the measurement), gain_vs_mtp_off, gain_vs_static,
    accept_length, published_output_len, published_gain, published_accept_length. Missing figures are NaN.
    """
    rows: list[dict[str, Any]] = []
    if table is not None:
        for b in table.buckets:
            rows.append({"bucket": b.name, "max_output_len": b.max_output_len, "chosen": b.engine_config().label(),
                         "concurrency": b.figures.concurrency if b.figures.concurrency is not None else np.nan,
                         "gain_vs_mtp_off": b.gains.get("mtp_off", np.nan),
                         "gain_vs_static": b.gains.get("static", np.nan),
                         "accept_length": b.figures.accept_length if b.figures.accept_length is not None else np.nan})
    else:
        ok = successful_primary_rows(results)
        if not ok.empty:
            best = _best_rows(ok)
            base = {key: _best_rows(ok[ok["role"] == role]) for role, key in BASELINE_ROLES.items()}
            for bucket, r in best.sort_values("max_output_len").iterrows():
                gains = {}
                for key, b in base.items():
                    t = b["output_throughput"].get(bucket, np.nan)
                    gains[key] = r["output_throughput"] / t - 1.0 if t and not math.isnan(t) else np.nan
                rows.append({"bucket": bucket, "max_output_len": int(r["max_output_len"]),
                             "chosen": r["engine_label"], "concurrency": r["concurrency"],
                             "gain_vs_mtp_off": gains["mtp_off"],
                             "gain_vs_static": gains["static"], "accept_length": r["accept_length"]})
    out = pd.DataFrame(rows, columns=["bucket", "max_output_len", "chosen", "concurrency", "gain_vs_mtp_off",
                                      "gain_vs_static", "accept_length"])
    pub = [_published_for(n) for n in out["max_output_len"]]
    out["published_output_len"] = [p.output_len if p else np.nan for p in pub]
    out["published_gain"] = [p.gain if p else np.nan for p in pub]
    out["published_accept_length"] = [p.accept_length if p else np.nan for p in pub]
    for col in ("gain_vs_mtp_off", "gain_vs_static", "accept_length"):
        out[col] = pd.to_numeric(out[col], errors="coerce")
    return out


def accept_length_table(results: pd.DataFrame) -> pd.DataFrame:
    """Mean measured accept length per draft-token count and bucket (speculative configs, primary load).

    Columns: num_draft_tokens, max_output_len, bucket, accept_length, n_configs.
    """
    ok = successful_primary_rows(results)
    spec = ok[ok["speculative"] & ok["accept_length"].notna()] if "speculative" in ok else ok.iloc[0:0]
    if spec.empty:
        return pd.DataFrame(columns=["num_draft_tokens", "max_output_len", "bucket", "accept_length", "n_configs"])
    out = (spec.groupby(["num_draft_tokens", "max_output_len", "bucket"], as_index=False)
           .agg(accept_length=("accept_length", "mean"), n_configs=("engine_key", "nunique"))
           .sort_values(["num_draft_tokens", "max_output_len"]))
    out["num_draft_tokens"] = out["num_draft_tokens"].astype(int)
    return out.reset_index(drop=True)


def pareto_front(df: pd.DataFrame, *, x: str = "tpot_ms_median", y: str = "output_throughput") -> pd.DataFrame:
    """Rows of ``df`` that no other row dominates, lower ``x`` (latency) and higher ``y`` (throughput)
    being better; a row dominates another when it is no worse in both and better in one. Rows with a
    missing ``x`` or ``y`` are ignored; duplicates of a front point are all kept. Sorted by ``x``."""
    pts = df[df[x].notna() & df[y].notna()]
    if pts.empty:
        return pts
    xs, ys = pts[x].to_numpy(float), pts[y].to_numpy(float)
    keep = np.ones(len(pts), dtype=bool)
    for i in range(len(pts)):
        dominated = (xs <= xs[i]) & (ys >= ys[i]) & ((xs < xs[i]) | (ys > ys[i]))
        keep[i] = not dominated.any()
    return pts[keep].sort_values([x, y], ascending=[True, False])


def routing_summary(table: RoutingTable | None, results: pd.DataFrame | None = None) -> pd.DataFrame:
    """The routing table as rows: bucket, max_output_len, config (label), output_throughput,
    accept_length, tpot_ms_median, gain_vs_mtp_off, gain_vs_static, cells (``band >=N: config``; ``any``
    for a cell of every band). Without a table, the best measured row per bucket (see :func:`gain_table`),
    cells empty."""
    cols = ["bucket", "max_output_len", "config", "output_throughput", "accept_length", "tpot_ms_median",
            "gain_vs_mtp_off", "gain_vs_static", "cells"]
    rows = []
    if table is not None:
        for b in table.buckets:
            rows.append({"bucket": b.name, "max_output_len": b.max_output_len, "config": b.engine_config().label(),
                         "output_throughput": b.figures.output_throughput, "accept_length": b.figures.accept_length,
                         "tpot_ms_median": b.figures.tpot_ms_median,
                         "gain_vs_mtp_off": b.gains.get("mtp_off"), "gain_vs_static": b.gains.get("static"),
                         "cells": "; ".join(f"{c.sampling or 'any'} >={c.min_in_flight}: "
                                            f"{c.engine_config().label()}" for c in b.cells)})
    elif results is not None:
        ok = successful_primary_rows(results)
        if not ok.empty:
            best = _best_rows(ok)
            gains = gain_table(results).set_index("bucket")
            for bucket, r in best.sort_values("max_output_len").iterrows():
                rows.append({"bucket": bucket, "max_output_len": int(r["max_output_len"]), "config": r["engine_label"],
                             "output_throughput": r["output_throughput"], "accept_length": r["accept_length"],
                             "tpot_ms_median": r["tpot_ms_median"],
                             "gain_vs_mtp_off": gains.loc[bucket, "gain_vs_mtp_off"],
                             "gain_vs_static": gains.loc[bucket, "gain_vs_static"], "cells": ""})
    return pd.DataFrame(rows, columns=cols)


def mixed_summary(table: RoutingTable | None, results: pd.DataFrame, *, top: int = 5) -> pd.DataFrame:
    """The buckets in proportion served by the routing table and by each of the best ``top`` single
    configs, predicted from the sweep's figures (:func:`tuning.choose.mix.predict_for_table`): deployment,
    predicted_output_throughput, table_vs_this (the table's gain over that deployment). Empty without a
    table or when no config was measured on every bucket."""
    from tuning.choose.mix import predict_for_table

    cols = ["deployment", "predicted_output_throughput", "table_vs_this"]
    pred = predict_for_table(table, normalise(results)) if table is not None else None
    if pred is None:
        return pd.DataFrame(columns=cols)
    labels = dict(zip(results["engine_key"], results["engine_label"]))
    rows = [{"deployment": f"routing table ({len(table.distinct_configs())} configs)",
             "predicted_output_throughput": pred.per_bucket_throughput, "table_vs_this": 0.0}]
    rows += [{"deployment": f"{labels.get(key, key)} for every bucket", "predicted_output_throughput": tput,
              "table_vs_this": pred.per_bucket_throughput / tput - 1} for key, tput in pred.singles[:top]]
    return pd.DataFrame(rows, columns=cols)


def failed_trials(results: pd.DataFrame) -> pd.DataFrame:
    """Failed measurements grouped by trial and reason: trial_id, role, config, buckets, reason."""
    failed = results[results["status"] == STATUS_FAILED]
    cols = ["trial_id", "role", "config", "buckets", "reason"]
    if failed.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for (trial, reason), g in failed.groupby(["trial_id", "failure_reason"], sort=False):
        labels = [lab for lab in g["engine_label"].unique() if lab] if "engine_label" in g else []
        buckets = [f"{b}@{int(c)}" if not math.isnan(c) else b for b, c in zip(g["bucket"], g["concurrency"])]
        rows.append({"trial_id": trial, "role": g["role"].iloc[0], "config": ", ".join(labels) or "(no config)",
                     "buckets": ", ".join(dict.fromkeys(buckets)), "reason": reason or "(no reason recorded)"})
    return pd.DataFrame(rows, columns=cols)


# ----- figures (pure: data in, Figure out) -----------------------------------------------------------------
def _new_figure(figsize: tuple[float, float]):
    from matplotlib.figure import Figure

    return Figure(figsize=figsize, layout="constrained")


def _banner(fig: Figure, simulated: bool, title: str) -> None:
    if simulated:
        fig.suptitle(f"SIMULATED -- {title}", color="#b00020", fontweight="bold")
    else:
        fig.suptitle(title, fontweight="bold")


_BASELINE_STYLE = {ROLE_MTP_OFF: dict(color="black", linestyle="--", marker="s"),
                   ROLE_STATIC: dict(color="#7a4fbf", linestyle="-.", marker="D")}


def plot_throughput_vs_length(results: pd.DataFrame, *, top: int = 3, simulated: bool = False) -> Figure:
    """(a) Output throughput vs bucket output length, one line per config; the ``top`` best and the
    baselines in colour and labelled, the others thin and grey."""
    data = throughput_by_length(results, top=top)
    fig = _new_figure((8, 5))
    ax = fig.add_subplot()
    if data.empty:
        ax.text(0.5, 0.5, "no successful measurement", ha="center", va="center", transform=ax.transAxes)
    others = data[~data["highlight"]]
    for _, g in others.groupby("engine_key", sort=False):
        ax.plot(g["max_output_len"], g["output_throughput"], color="0.75", linewidth=0.8, marker=".", zorder=1)
    if not others.empty:
        ax.plot([], [], color="0.75", linewidth=0.8, label=f"other configs ({others['engine_key'].nunique()})")
    for _, g in data[data["highlight"]].groupby("engine_key", sort=False):
        role = g["role"].iloc[0]
        style = _BASELINE_STYLE.get(role, dict(marker="o"))
        ax.plot(g["max_output_len"], g["output_throughput"], linewidth=2, label=g["label"].iloc[0], zorder=3, **style)
    ax.set_xscale("log", base=2)
    ticks = sorted(data["max_output_len"].unique()) if not data.empty else []
    ax.set_xticks(ticks, [str(int(t)) for t in ticks])
    ax.set_xlabel("bucket max output length (tokens)")
    ax.set_ylabel("output throughput (tok/s, primary load)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    _banner(fig, simulated, "output throughput vs output length")
    return fig


def plot_gain_vs_published(gains: pd.DataFrame, *, simulated: bool = False) -> Figure:
    """(b) Grouped bars per bucket: the measured gain of the chosen config over MTP off beside the
    published gain for the same output length (``gains`` from :func:`gain_table`)."""
    fig = _new_figure((8, 5))
    ax = fig.add_subplot()
    n = len(gains)
    x = np.arange(n)
    w = 0.38
    measured = gains["gain_vs_mtp_off"].to_numpy(float) * 100
    published = gains["published_gain"].to_numpy(float) * 100
    conc = sorted({int(c) for c in gains["concurrency"].dropna()}) if "concurrency" in gains else []
    at = f" (concurrency {', '.join(map(str, conc))})" if conc else ""
    b1 = ax.bar(x - w / 2, np.nan_to_num(measured), w, label=f"measured: chosen config vs MTP off{at}", color="#1f77b4")
    b2 = ax.bar(x + w / 2, np.nan_to_num(published), w, label=PUBLISHED_SOURCE, color="#ff7f0e")
    for bars, vals in ((b1, measured), (b2, published)):
        for rect, v in zip(bars, vals):
            txt = "n/a" if math.isnan(v) else f"{v:+.1f}%"
            ax.annotate(txt, (rect.get_x() + rect.get_width() / 2, max(rect.get_height(), 0)), ha="center",
                        va="bottom", fontsize="small", xytext=(0, 2), textcoords="offset points")
    labels = []
    for _, r in gains.iterrows():
        pub = "" if math.isnan(r["published_output_len"]) else f"\n(published {int(r['published_output_len'])})"
        labels.append(f"{r['bucket']}{pub}")
    ax.set_xticks(x, labels)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_ylabel("output-throughput gain over MTP off (%)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize="small", loc="upper left")
    _banner(fig, simulated, "MTP gain per bucket vs the published table")
    return fig


def plot_accept_length(acc: pd.DataFrame, *, simulated: bool = False) -> Figure:
    """(c) Accept length vs output length, one line per draft-token count, with the published points."""
    fig = _new_figure((8, 5))
    ax = fig.add_subplot()
    for n, g in acc.groupby("num_draft_tokens"):
        ax.plot(g["max_output_len"], g["accept_length"], marker="o", label=f"{int(n)} draft tokens")
    ax.plot([p.output_len for p in PUBLISHED], [p.accept_length for p in PUBLISHED], "k*", markersize=12,
            linestyle=":", label=f"{PUBLISHED_SOURCE} (static MTP)")
    ax.set_xscale("log", base=2)
    ticks = sorted(set(acc["max_output_len"].astype(int)) | {p.output_len for p in PUBLISHED})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("bucket max output length (tokens)")
    ax.set_ylabel("accept length (tokens per verify step, incl. the bonus token)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    if acc.empty:
        ax.text(0.5, 0.5, "no MTP measurement with an accept length", ha="center", va="center", transform=ax.transAxes)
    _banner(fig, simulated, "accept length vs output length")
    return fig


def plot_tpot_vs_throughput(results: pd.DataFrame, *, simulated: bool = False) -> Figure:
    """(d) Median TPOT vs output throughput, one panel per bucket (primary load); Pareto front as a
    step line, baselines marked."""
    ok = successful_primary_rows(results)
    buckets = (ok[["bucket", "max_output_len"]].drop_duplicates().sort_values("max_output_len")["bucket"].tolist()
               if not ok.empty else [])
    ncols = min(max(len(buckets), 1), 3)
    nrows = max(1, math.ceil(len(buckets) / ncols))
    fig = _new_figure((4.2 * ncols, 3.6 * nrows))
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[len(buckets):]:
        ax.set_visible(False)
    drafts = sorted(int(n) for n in ok.loc[ok["speculative"], "num_draft_tokens"].dropna().unique()) \
        if "speculative" in ok else []
    from matplotlib import colormaps
    from matplotlib.colors import BoundaryNorm

    cmap = colormaps["viridis"].resampled(max(len(drafts), 1))
    bounds = [d - 0.5 for d in drafts] + [drafts[-1] + 0.5] if drafts else [0.5, 1.5]
    norm = BoundaryNorm(bounds, cmap.N)
    mappable = None
    if not buckets:
        axes[0].set_visible(True)
        axes[0].text(0.5, 0.5, "no successful measurement", ha="center", va="center", transform=axes[0].transAxes)
    for ax, bucket in zip(axes, buckets):
        g = ok[ok["bucket"] == bucket]
        spec = g["speculative"] if "speculative" in g else pd.Series(False, index=g.index)
        ax.scatter(g.loc[~spec, "tpot_ms_median"], g.loc[~spec, "output_throughput"], s=18, color="0.5",
                   label="MTP off configs")
        sc = ax.scatter(g.loc[spec, "tpot_ms_median"], g.loc[spec, "output_throughput"], s=18,
                        c=g.loc[spec, "num_draft_tokens"], cmap=cmap, norm=norm, label="MTP configs (colour: drafts)")
        front = pareto_front(g)
        ax.step(front["tpot_ms_median"], front["output_throughput"], where="post", color="#d62728", linewidth=1.5,
                label="Pareto front")
        ax.scatter(front["tpot_ms_median"], front["output_throughput"], s=60, facecolors="none",
                   edgecolors="#d62728")
        for role, style in _BASELINE_STYLE.items():
            b = g[g["role"] == role]
            if not b.empty:
                ax.scatter(b["tpot_ms_median"], b["output_throughput"], marker=style["marker"], s=50,
                           color=style["color"], label=ROLE_LABELS[role], zorder=4)
        ax.set_title(bucket)
        ax.set_xlabel("median TPOT (ms)")
        ax.set_ylabel("output throughput (tok/s)")
        ax.grid(True, alpha=0.3)
        mappable = sc if len(g.loc[spec]) else mappable
    if mappable is not None:
        fig.colorbar(mappable, ax=axes[:len(buckets)].tolist(), label="draft tokens", ticks=drafts)
    if buckets:
        axes[0].legend(fontsize="x-small")
    _banner(fig, simulated, "TPOT vs throughput per bucket (up and to the left is better)")
    return fig


def build_figures(run: SweepRun, *, top: int = 3) -> dict[str, Figure]:
    """The four figures, keyed like :data:`FIGURE_FILES`."""
    sim = run.simulated
    return {
        "throughput": plot_throughput_vs_length(run.results, top=top, simulated=sim),
        "gain": plot_gain_vs_published(gain_table(run.results, run.table), simulated=sim),
        "accept": plot_accept_length(accept_length_table(run.results), simulated=sim),
        "pareto": plot_tpot_vs_throughput(run.results, simulated=sim),
    }


# ----- HTML (pure: strings in, string out) ----------------------------------------------------------------
def _fmt(v: Any, kind: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "&ndash;"
    if kind == "pct":
        return f"{float(v) * 100:+.2f}%"
    if kind == "num":
        return f"{float(v):,.1f}"
    if kind == "int":
        return str(int(v))
    if kind == "acc":
        return f"{float(v):.2f}"
    return html.escape(str(v))


def _html_table(df: pd.DataFrame, kinds: dict[str, str]) -> str:
    if df.empty:
        return "<p><em>none</em></p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in df.columns)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(r[c], kinds.get(c, ''))}</td>" for c in df.columns) + "</tr>"
                   for _, r in df.iterrows())
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}
.banner{background:#b00020;color:#fff;font-weight:bold;padding:.6em 1em;font-size:1.2em}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}
th{background:#f3f3f3}img{max-width:100%;border:1px solid #eee}.note{color:#555}"""


def render_html(run: SweepRun, images: dict[str, str]) -> str:
    """The report page. ``images`` maps figure key -> ``src`` (a relative file name or a data: URI)."""
    sim = run.simulated
    title = f"{'SIMULATED ' if sim else ''}sweep report: {run.sweep_id}"
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{_CSS}</style></head><body>"]
    if sim:
        parts.append("<div class='banner'>SIMULATED: every figure on this page comes from the simulated engine "
                     "(orchestrator.sim), not from GPUs.</div>")
    parts.append(f"<h1>{html.escape(title)}</h1>")
    if run.table is not None:
        p = run.table.provenance
        parts.append(f"<p>model <code>{html.escape(p.model)}</code>, {p.gpu_count}x {html.escape(p.gpu_type)}, "
                     f"created {html.escape(p.created_at)}, objective {html.escape(p.objective)}, constraints "
                     f"{html.escape(str(p.constraints or 'none'))}, routing table version {run.table.version}</p>")
    n_trials = run.results["trial_id"].nunique()
    n_failed = run.results.loc[run.results["status"] == STATUS_FAILED, "trial_id"].nunique()
    parts.append(f"<p>{n_trials} trials, {run.results['engine_key'].replace('', np.nan).nunique()} distinct configs, "
                 f"{run.results['bucket'].nunique()} buckets, {n_failed} trial(s) with failures.</p>")
    for note in run.notes:
        parts.append(f"<p class='note'>{html.escape(note)}</p>")
    parts.append("<h2>Routing table</h2>")
    parts.append(_html_table(routing_summary(run.table, run.results), {
        "output_throughput": "num", "accept_length": "acc", "tpot_ms_median": "acc",
        "gain_vs_mtp_off": "pct", "gain_vs_static": "pct"}))
    if run.table is not None and run.table.provenance.notes:
        parts.append("<h2>Within noise</h2><p>Where a bucket's or a cell's best measured config was not shown "
                     "better than the one that would serve it otherwise (the 95 % interval of their throughput "
                     "ratio, at the noise of a round and of an engine start pooled over the sweep, holds 1), that "
                     "one serves it:</p>")
        parts.extend(f"<p class='note'>{html.escape(n)}</p>" for n in run.table.provenance.notes)
    budget = run.table.provenance.gpu_budget if run.table is not None else None
    if budget is not None:
        parts.append(f"<h2>Serving budget: {budget.gpus} GPU(s){' shared' if budget.share_gpu else ''}</h2>")
        if budget.replicas:
            configs = run.table.distinct_configs()
            parts.append("<p>Replicas the deploy runs (sized by each config's share of the traffic's work): "
                         + ", ".join(f"<code>{html.escape(configs[k].label())}</code> x{n}"
                                     for k, n in budget.replicas.items()) + ".</p>")
        parts.extend(f"<p class='note'>{html.escape(n)}</p>" for n in budget.notes)
    mixed = mixed_summary(run.table, run.results)
    if not mixed.empty:
        parts.append("<h2>Mixed workload: the table vs one config everywhere (predicted)</h2>"
                     "<p>Each bucket's workload once, served at each bucket's measured rate: does running one config "
                     "per bucket pay over the best single config? A prediction from these figures, not a "
                     "measurement; within the figures' run-to-run noise it is no gain.</p>")
        parts.append(_html_table(mixed, {"predicted_output_throughput": "num", "table_vs_this": "pct"}))
    sections = [
        ("throughput", "Output throughput vs output length",
         "One line per config at each bucket's primary load. The best few configs and both baselines are in colour."),
        ("gain", "MTP gain per bucket vs the published table",
         "Gain of each bucket's chosen config over the MTP-off baseline, measured under the same workload, beside "
         "the published Intern-S2-Preview 8xH200 figures (concurrency 64, temperature 0)."),
        ("accept", "Accept length vs output length",
         "Mean accepted tokens per verify step for each draft-token count; stars are the published accept lengths."),
        ("pareto", "TPOT vs throughput (Pareto front)",
         "Each point is a config on one bucket; the red step line joins configs no other config beats on both "
         "lower median TPOT and higher throughput."),
    ]
    for key, h, text in sections:
        if key in images:
            parts.append(f"<h2>{html.escape(h)}</h2><p>{html.escape(text)}</p>"
                         f"<img src='{html.escape(images[key], quote=True)}' alt='{html.escape(h)}'>")
    parts.append("<h2>Gains by bucket</h2>")
    parts.append(_html_table(gain_table(run.results, run.table), {
        "gain_vs_mtp_off": "pct", "gain_vs_static": "pct", "published_gain": "pct", "accept_length": "acc",
        "published_accept_length": "acc", "published_output_len": "int", "concurrency": "int"}))
    parts.append("<h2>Failed trials</h2>")
    parts.append(_html_table(failed_trials(run.results), {}))
    parts.append("</body></html>")
    return "\n".join(parts)


# ----- files ----------------------------------------------------------------------------------------------
def write_report(run: SweepRun, out_dir: str | Path, *, top: int = 3, embed: bool = True) -> dict[str, Path]:
    """Write the four PNGs and ``report.html`` under ``out_dir``; returns key -> path (``html`` too).

    With ``embed`` the page carries the images as base64 data URIs (one self-contained file);
    otherwise it references the PNGs next to it.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figures = build_figures(run, top=top)
    paths: dict[str, Path] = {}
    srcs: dict[str, str] = {}
    for key, fig in figures.items():
        path = out / FIGURE_FILES[key]
        fig.savefig(path, dpi=110)
        paths[key] = path
        srcs[key] = ("data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()) if embed else path.name
    page = out / "report.html"
    page.write_text(render_html(run, srcs), encoding="utf-8")
    paths["html"] = page
    return paths


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tuning.report",
        description="Figures and one self-contained HTML page from a sweep's run dir (results.parquet and "
                    "routing_table.json written by `python -m tuning.sweep`): throughput vs output length, MTP gain "
                    "vs the published table, accept length vs output length, TPOT vs throughput with the Pareto "
                    "front, the routing table and the failed trials. Simulated sweeps are labelled SIMULATED.",
    )
    p.add_argument("run_dir", metavar="RESULTS_DIR", help="the sweep's run dir (e.g. runs/sweep-20260101-abc123)")
    p.add_argument("--out", metavar="DIR", help="output folder (default RESULTS_DIR/report)")
    p.add_argument("--top", type=int, default=3, help="configs highlighted in the throughput plot (default 3)")
    p.add_argument("--no-embed", action="store_true",
                   help="reference the PNGs from the HTML instead of embedding them (smaller page)")
    return p


REPORT_EXTRA = "report"
"""The pyproject extra that installs what the report draws with (matplotlib), the notebook runner and
``optuna-dashboard`` (the sweep's "open study" command); the base install leaves them out."""


def missing_extra_hint() -> str | None:
    """What to install when matplotlib is missing (``None`` when it imports): the base install has no
    plotting library, and a raw ``ModuleNotFoundError`` says nothing of the extra that brings it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return (f"the report draws its figures with matplotlib, which is not installed; install the "
                f"{REPORT_EXTRA!r} extra (matplotlib, the notebook runner, optuna-dashboard): "
                f"python3 -m pip install -e '.[{REPORT_EXTRA}]' in a clone of this repository, or "
                f"python3 -m pip install 'mtp-autotune[{REPORT_EXTRA}]'")
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if (hint := missing_extra_hint()) is not None:
        print(f"error: {hint}", file=sys.stderr)
        return 2
    try:
        run = load_run(args.run_dir)
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path(args.run_dir) / "report"
    paths = write_report(run, out, top=args.top, embed=not args.no_embed)
    for note in run.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"{'SIMULATED ' if run.simulated else ''}report: {paths['html']}")
    for key in FIGURE_FILES:
        print(f"  {paths[key]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
