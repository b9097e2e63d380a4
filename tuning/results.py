"""Sweep results as a table, and the pure choice of the routing table from it.

One row per trial x bucket x concurrency (see :data:`ROW_COLUMNS`). Trials produce rows
(:func:`rows_for_trial`), the sweep collects them into a DataFrame, :func:`pick_best` turns the
DataFrame into a :class:`~orchestrator.table.RoutingTable` without touching files, and
:func:`write_results` / :func:`commit_table` do the I/O. An incomplete sweep (a bucket without a
successful trial, a baseline missing) raises :class:`IncompleteResultsError` *before* anything is
committed, so a good table already at the target path stays.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from orchestrator import table as routing
from orchestrator.config import EngineConfig
from orchestrator.table import (
    BucketFigures,
    BucketRoute,
    Cell,
    GpuBudget,
    LoadVariant,
    Provenance,
    RoutingTable,
    RoutingTableError,
)
from tuning.buckets import Bucket
from tuning.stats import PooledNoise, mean_confidence_interval
from tuning.sweep.space import BASELINE_ROLES, ROLE_MTP_OFF, ROLE_STATIC

if TYPE_CHECKING:
    from tuning.cells import Undecided

__all__ = [
    "BUDGET_CANDIDATES",
    "BUSY_HOST_SHARE",
    "CELL_MIN_GAIN",
    "CONFIG_COLUMNS",
    "ROW_COLUMNS",
    "Constraints",
    "IncompleteResultsError",
    "STATUS_OK",
    "STATUS_FAILED",
    "behind_schedule_rows",
    "busy_host_rows",
    "cell_measurements",
    "commit_table",
    "gains_over",
    "config_of_row",
    "failed_rows",
    "pick_best",
    "primary_rows",
    "measured_at_primary",
    "is_cached_copy",
    "repeat_throughputs",
    "results_frame",
    "rows_for_trial",
    "successful_primary_rows",
    "undecided_cells",
    "write_results",
]

STATUS_OK = "ok"
STATUS_FAILED = "failed"

CONFIG_COLUMNS = ("engine_key", "engine_label", "backend", "engine", "model", "tp", "speculative", "num_draft_tokens",
                  "memory_fraction", "max_batch_size", "session_len", "max_prefill_tokens", "extra_flags",
                  "simulated_backend")
FIGURE_COLUMNS = (
    "output_throughput", "request_throughput", "input_throughput", "total_token_throughput",
    "ttft_ms_mean", "ttft_ms_median", "ttft_ms_p99", "tpot_ms_mean", "tpot_ms_median", "tpot_ms_p99",
    "itl_ms_mean", "itl_ms_median", "itl_ms_p99", "e2e_ms_mean", "e2e_ms_median", "e2e_ms_p99",
    "accept_length", "completed", "failed_requests", "duration_s", "early_stopped", "simulated", "time_scale",
    "started_at", "finished_at", "output_throughput_repeats", "output_throughput_spread", "host_cpu_busy_max",
    "sim_lag_share_max",
)
ROW_COLUMNS = (
    "sweep_id", "trial_id", "role", "status", "failure_reason", "cached", "bucket", "max_output_len",
    "concurrency", "temperature", "sampling_band", "primary_load", *CONFIG_COLUMNS, *FIGURE_COLUMNS,
    "engine_startup_s", "workload",
)


BUSY_HOST_SHARE = 0.9
"""A real engine's measurement taken while the host's CPUs were at least this busy (share of all CPU
time, the engine and its client included) is flagged: a launch-bound engine beside one busy process per
CPU measures slower than on a quiet host, by as much as the differences a sweep ranks."""


def busy_host_rows(df: pd.DataFrame, share: float = BUSY_HOST_SHARE) -> pd.DataFrame:
    """The successful rows of real engines measured while the host's CPUs were at least ``share`` busy
    (``host_cpu_busy_max``; rows without it, simulated ones, are never flagged)."""
    if df.empty or "host_cpu_busy_max" not in df.columns:
        return df.iloc[0:0]
    real = df["simulated"].astype("boolean").fillna(False).eq(False) if "simulated" in df.columns else True
    busy = pd.to_numeric(df["host_cpu_busy_max"], errors="coerce").ge(share)
    return df[df["status"].eq(STATUS_OK) & real & busy]


def behind_schedule_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The successful rows of simulated engines that ran further behind their schedule than
    :data:`tuning.drive.summary.MAX_LAG_SHARE` of the measurement (``sim_lag_share_max``): their figures
    measure the host's load as much as the config."""
    from tuning.drive.summary import MAX_LAG_SHARE

    if df.empty or "sim_lag_share_max" not in df.columns:
        return df.iloc[0:0]
    late = pd.to_numeric(df["sim_lag_share_max"], errors="coerce").gt(MAX_LAG_SHARE)
    return df[df["status"].eq(STATUS_OK) & late]


class IncompleteResultsError(RoutingTableError):
    """The sweep's results can't make a complete routing table; the previous table is kept."""


@dataclass(frozen=True)
class Constraints:
    """Latency limits a bucket's chosen config must meet (medians of the measured distribution)."""

    max_tpot_ms: float | None = None
    max_ttft_ms: float | None = None

    def to_dict(self) -> dict[str, float]:
        return {k: v for k, v in (("max_tpot_ms", self.max_tpot_ms), ("max_ttft_ms", self.max_ttft_ms)) if v is not None}

    def mask(self, df: pd.DataFrame) -> pd.Series:
        ok = pd.Series(True, index=df.index)
        if self.max_tpot_ms is not None:
            ok &= df["tpot_ms_median"].le(self.max_tpot_ms)
        if self.max_ttft_ms is not None:
            ok &= df["ttft_ms_median"].le(self.max_ttft_ms)
        return ok


# ----- rows ---------------------------------------------------------------------------------------------
def config_columns(config: EngineConfig) -> dict[str, Any]:
    return {
        "engine_key": config.key(), "engine_label": config.label(), "backend": config.backend,
        "engine": config.engine_name,  # the engine run or simulated (pytorch, turbomind, vllm)
        "model": config.model, "tp": config.tp, "speculative": config.speculative,
        "num_draft_tokens": config.num_draft_tokens, "memory_fraction": config.memory_fraction,
        "max_batch_size": config.max_batch_size, "session_len": config.session_len,
        "max_prefill_tokens": config.max_prefill_tokens, "extra_flags": " ".join(config.extra_flags),
        "simulated_backend": config.simulated_backend,
    }


def repeat_throughputs(row: Mapping[str, Any]) -> list[float]:
    """Every run's output throughput of a row (``output_throughput_repeats`` as :func:`figure_columns`
    writes it), or the row's one figure when it was measured once."""
    repeats = row.get("output_throughput_repeats")
    if isinstance(repeats, str) and repeats:
        return [float(x) for x in repeats.split(";")]
    return [float(row["output_throughput"])]


def is_cached_copy(row: Mapping[str, Any]) -> bool:
    """Whether ``row`` is a cached copy: a duplicate config handed the rows another trial measured. The
    results hold that trial's own rows too, so a copy adds no measurement (nor another engine start)."""
    cached = row.get("cached")
    return cached is True or str(cached).strip().lower() in ("true", "1", "1.0")


def figure_columns(bench: Mapping[str, Any]) -> dict[str, Any]:
    """Flatten a ``BenchResult.to_dict()`` into the row's figure columns."""
    out: dict[str, Any] = {}
    for k in ("output_throughput", "request_throughput", "input_throughput", "total_token_throughput",
              "accept_length", "completed", "duration_s", "early_stopped", "simulated", "time_scale",
              "started_at", "finished_at"):
        out[k] = bench.get(k)
    out["failed_requests"] = bench.get("failed")
    # Repeated runs on one engine (``--repeats``): every run's throughput, and their spread
    # (max - min) / median, so noise is read next to the figure it qualifies.
    reps = [float(x) for x in bench.get("repeat_output_throughputs") or () if x is not None]
    out["output_throughput_repeats"] = ";".join(f"{x:.1f}" for x in reps) if reps else None
    mid = sorted(reps)[len(reps) // 2] if reps else 0.0
    out["output_throughput_spread"] = round((max(reps) - min(reps)) / mid, 4) if len(reps) > 1 and mid > 0 else None
    # The worst any of those runs was disturbed: the host's CPUs busy (share of all CPU time, 0-1), and a
    # simulated engine behind its schedule (mean lag over the run's duration).
    for col, one, many in (("host_cpu_busy_max", "host_cpu_busy", "repeat_host_cpu_busy"),
                           ("sim_lag_share_max", "sim_lag_share", "repeat_sim_lag_share")):
        vals = [float(x) for x in bench.get(many) or (bench.get(one),) if x is not None]
        out[col] = max(vals) if vals else None
    for lat in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        stats = bench.get(lat) or {}
        for s in ("mean", "median", "p99"):
            out[f"{lat}_{s}"] = stats.get(s)
    return out


def bench_status(bench: Mapping[str, Any]) -> tuple[str, str]:
    """A bucket measurement counts only when no request failed: a config that drops requests must
    not win on the throughput of the ones it kept. A run stopped early at steady state may have
    completed none (long outputs): its cancelled requests are not failures."""
    completed, failed = int(bench.get("completed") or 0), int(bench.get("failed") or 0)
    if completed == 0 and not (bench.get("early_stopped") and bench.get("steady_state")):
        return STATUS_FAILED, f"no request completed; failures: {bench.get('failure_reasons') or {}}"
    if failed:
        return STATUS_FAILED, f"{failed} of {completed + failed} requests failed: {bench.get('failure_reasons') or {}}"
    return STATUS_OK, ""


def rows_for_trial(
    *,
    sweep_id: str,
    trial_id: str,
    role: str,
    config: EngineConfig,
    buckets: Sequence[Bucket],
    measurements: Mapping[tuple[str, int], Mapping[str, Any]],
    failure: str = "",
    engine_startup_s: float | None = None,
) -> list[dict[str, Any]]:
    """Every bucket x concurrency x temperature row of one trial. ``measurements[key]`` (key:
    :meth:`Bucket.measurement_key`) is a ``BenchResult.to_dict()``; a missing one is a failed row with
    ``failure`` as its reason."""
    base = {"sweep_id": sweep_id, "trial_id": trial_id, "role": role, "cached": False,
            "engine_startup_s": engine_startup_s, **config_columns(config)}
    rows = []
    for b in buckets:
        for c, t in b.points():
            row = {**base, **_point_columns(b, c, t),
                   "workload": json.dumps(b.workload_at(c, t).to_dict(), sort_keys=True)}
            bench = measurements.get(b.measurement_key(c, t))
            if bench is None:
                row.update(status=STATUS_FAILED, failure_reason=failure or "not measured")
            else:
                status, reason = bench_status(bench)
                if status == STATUS_FAILED and failure:
                    # The requests failed *because* the engine did (died, hung): say so, or the row
                    # shows only "connection" / "timeout" counts.
                    reason = f"{reason}; {failure}"
                row.update(figure_columns(bench), status=status, failure_reason=reason)
            rows.append(row)
    return rows


def _point_columns(b: Bucket, concurrency: int, temperature: float) -> dict[str, Any]:
    band = routing.band_of(temperature)
    return {"bucket": b.name, "max_output_len": b.max_output_len, "concurrency": concurrency,
            "temperature": temperature, "sampling_band": band.name if band else None,
            "primary_load": b.is_primary(concurrency, temperature)}


def failed_rows(*, sweep_id: str, trial_id: str, role: str, config: EngineConfig | None,
                buckets: Sequence[Bucket], reason: str) -> list[dict[str, Any]]:
    if config is None:
        base = {"sweep_id": sweep_id, "trial_id": trial_id, "role": role, "status": STATUS_FAILED,
                "failure_reason": reason, "cached": False}
        return [{**base, **_point_columns(b, c, t)} for b in buckets for c, t in b.points()]
    return rows_for_trial(sweep_id=sweep_id, trial_id=trial_id, role=role, config=config, buckets=buckets,
                          measurements={}, failure=reason)


def results_frame(rows: Iterable[Any]) -> pd.DataFrame:
    """Rows -> DataFrame with every :data:`ROW_COLUMNS` column, in that order (extra columns after).
    A row is a mapping, or a typed row with ``to_dict()`` (:class:`tuning.sweep.records.ResultRow`)."""
    df = pd.DataFrame([r.to_dict() if hasattr(r, "to_dict") else dict(r) for r in rows])
    for col in ROW_COLUMNS:
        if col not in df.columns:
            df[col] = None
    extra = [c for c in df.columns if c not in ROW_COLUMNS]
    df = df[[*ROW_COLUMNS, *extra]]
    for col in ("output_throughput", "tpot_ms_median", "ttft_ms_median", "memory_fraction", "accept_length"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    return df


def primary_rows(results: pd.DataFrame) -> pd.DataFrame:
    """The rows measured at their bucket's primary load and temperature (every row of results from before
    the ``primary_load`` column)."""
    return results[results["primary_load"].astype(bool)] if "primary_load" in results else results


def successful_primary_rows(results: pd.DataFrame) -> pd.DataFrame:
    """The rows that stand for a config on a bucket: measured without failure, with a throughput, at the
    bucket's primary load (every such row in results from before the ``primary_load`` column)."""
    return primary_rows(results[(results["status"] == STATUS_OK) & results["output_throughput"].notna()])


def write_results(df: pd.DataFrame, run_dir: str | Path) -> tuple[Path, Path]:
    """``<run_dir>/results.parquet`` and ``results.csv`` (written whole each time; cheap)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    pq, csv = run_dir / "results.parquet", run_dir / "results.csv"
    frame = df.copy()
    for col in frame.columns:  # parquet needs one type per column; mixed None/obj columns become strings
        if frame[col].dtype == object:
            non_null = frame[col].dropna()
            if not non_null.map(type).nunique() <= 1:
                frame[col] = frame[col].map(lambda v: None if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))
    tmp = pq.with_name(".results.parquet.tmp")
    frame.to_parquet(tmp, index=False)
    tmp.replace(pq)
    tmp = csv.with_name(".results.csv.tmp")
    frame.to_csv(tmp, index=False)
    tmp.replace(csv)
    return pq, csv


# ----- choice (pure) -----------------------------------------------------------------------------------
def _figures(row: Mapping[str, Any]) -> BucketFigures:
    def num(k: str) -> float | None:
        v = row.get(k)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return None
        # A negative latency is a measurement artefact (clock skew between client and a time-scaled
        # simulator); drop the figure rather than refuse the whole table.
        return float(v) if float(v) >= 0 else None

    acc = num("accept_length")
    completed, failed = row.get("completed"), row.get("failed_requests")
    interval = throughput_interval(row)
    return BucketFigures(
        output_throughput_ci=interval, rounds=len(repeat_throughputs(row)) if interval is not None else None,
        output_throughput=float(row["output_throughput"]),
        request_throughput=num("request_throughput"),  # noqa: E501
        ttft_ms_median=num("ttft_ms_median"), ttft_ms_p99=num("ttft_ms_p99"),
        tpot_ms_median=num("tpot_ms_median"), tpot_ms_p99=num("tpot_ms_p99"),
        accept_length=acc if acc is not None and acc >= 1 else None,
        concurrency=int(row["concurrency"]) if row.get("concurrency") is not None else None,
        completed=None if completed is None or (isinstance(completed, float) and math.isnan(completed)) else int(completed),
        failed=None if failed is None or (isinstance(failed, float) and math.isnan(failed)) else int(failed),
    )


def config_of_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """The engine config (as a dict) that a results row was measured with, rebuilt from its columns."""
    flags = row.get("extra_flags") or ""
    cfg = {
        "backend": row["backend"], "model": row["model"], "tp": int(row["tp"]),
        "speculative_algorithm": "qwen3_5_mtp" if bool(row["speculative"]) else None,
        "num_draft_tokens": int(row["num_draft_tokens"]), "memory_fraction": float(row["memory_fraction"]),
        "max_batch_size": None if _isnull(row.get("max_batch_size")) else int(row["max_batch_size"]),
        "session_len": None if _isnull(row.get("session_len")) else int(row["session_len"]),
        "max_prefill_tokens": int(row["max_prefill_tokens"]),
        "extra_flags": flags.split() if isinstance(flags, str) else list(flags),
        "simulated_backend": None if _isnull(row.get("simulated_backend")) else row["simulated_backend"],
    }
    return EngineConfig.from_dict(cfg).to_dict()


def _isnull(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _ranked(df: pd.DataFrame) -> list[dict[str, Any]]:
    """One row per engine config, best first: highest throughput; ties -> fewer draft tokens, then
    lower memory fraction (cheaper, safer)."""
    if df.empty:
        return []
    ordered = df.sort_values(["output_throughput", "num_draft_tokens", "memory_fraction"],
                             ascending=[False, True, True], kind="mergesort")
    return ordered.drop_duplicates("engine_key", keep="first").to_dict("records")


def _best_row(df: pd.DataFrame) -> Mapping[str, Any] | None:
    ranked = _ranked(df)
    return ranked[0] if ranked else None


BUDGET_CANDIDATES = 5
"""Under a GPU budget, the configs a bucket may be given: its own best few (eligible, at its primary
load), plus any other bucket's best few that were measured eligible on it too, since an engine that
serves two buckets costs its GPUs once."""


def _log_tput(row: Mapping[str, Any]) -> float:
    t = float(row["output_throughput"])
    return math.log(t) if t > 0 else -math.inf


def _engine(row: Mapping[str, Any]) -> EngineConfig:
    return EngineConfig.from_dict(config_of_row(row))


def _fit_primaries(ranked: Sequence[Sequence[dict[str, Any]]], budget: GpuBudget) -> list[dict[str, Any]] | None:
    """Per bucket one of its candidate rows such that one engine per distinct config fits ``budget``,
    maximising the sweep's scalar objective (mean over buckets of log output throughput); ties ->
    fewer distinct engines, then the better-ranked candidates. ``None`` when no combination fits.

    Depth-first over the buckets with each bucket's options best first, so the first complete
    combination is the unconstrained best; a branch is cut when even the best options of the
    remaining buckets cannot beat the best fitting combination, or when the reservations alone
    (their sum) exceed the budget: a lower bound of any packing, so no cut loses a fitting
    combination (FFD itself is not monotone and is only asked of complete combinations).
    """
    top = {r["engine_key"] for rows in ranked for r in rows[:BUDGET_CANDIDATES]}
    options = [[r for i, r in enumerate(rows) if i < BUDGET_CANDIDATES or r["engine_key"] in top] for rows in ranked]
    engines = {r["engine_key"]: _engine(r) for rows in options for r in rows}
    reserve = {k: cfg.gpu_request(share_gpu=budget.share_gpu) for k, cfg in engines.items()}
    tail = [0.0] * (len(options) + 1)  # best attainable score of buckets i..end
    for i in range(len(options) - 1, -1, -1):
        tail[i] = tail[i + 1] + _log_tput(options[i][0])
    best: tuple[tuple[float, int], list[dict[str, Any]]] | None = None

    def visit(i: int, chosen: list[dict[str, Any]], score: float) -> None:
        nonlocal best
        if i == len(options):
            keys = {r["engine_key"] for r in chosen}
            rank = (score, -len(keys))
            if (best is None or rank > best[0]) and budget.fits(engines[k] for k in keys):
                best = (rank, list(chosen))
            return
        for row in options[i]:
            s = score + _log_tput(row)
            if best is not None and s + tail[i + 1] < best[0][0]:
                break  # options are best first: the rest of this bucket's can only do worse
            keys = {r["engine_key"] for r in chosen} | {row["engine_key"]}
            if sum(reserve[k] for k in keys) > budget.gpus + 1e-9:
                continue
            visit(i + 1, [*chosen, row], s)

    visit(0, [], 0.0)
    return None if best is None else best[1]


def _load_variant(ranked_at_c: Sequence[dict[str, Any]], primary_key: str, placed: dict[str, EngineConfig],
                  budget: GpuBudget | None) -> dict[str, Any] | None:
    """The config for a higher load level: the best one at that level, unless it is the bucket's own
    config (no variant). Under a budget, the best one that beats the bucket's config there and fits
    beside the engines ``placed`` so far (which it joins); none if none does."""
    for row in ranked_at_c:
        if row["engine_key"] == primary_key:
            return None
        if budget is None or row["engine_key"] in placed or budget.fits([*placed.values(), _engine(row)]):
            placed.setdefault(row["engine_key"], _engine(row))
            return row
    return None


def throughput_interval(row: Mapping[str, Any]) -> tuple[float, float] | None:
    """The 95 % confidence interval of a row's output throughput over its rounds (``--repeats``), low
    end clipped at 0; ``None`` for a row measured once."""
    runs = repeat_throughputs(row)
    if len(runs) < 2:
        return None
    _, low, high = mean_confidence_interval(runs)
    return max(low, 0.0), high


def within_noise(a: Mapping[str, Any], b: Mapping[str, Any], noise: PooledNoise | None = None) -> bool:
    """Neither row is shown better than the other. With the sweep's pooled ``noise``: the interval of
    their throughput ratio holds 1. Without: both have intervals over rounds and they overlap. Rows
    measured once, with no pooled noise, are never within noise of each other (their point figures rank
    them, as the sweep always did); measure with ``--repeats`` for the ranking to respect the noise."""
    if noise is not None:
        return not noise.different(repeat_throughputs(a), repeat_throughputs(b))
    ia, ib = throughput_interval(a), throughput_interval(b)
    return ia is not None and ib is not None and ia[0] <= ib[1] and ib[0] <= ia[1]


def pooled_noise(rows: pd.DataFrame) -> PooledNoise | None:
    """The noise of one round, and of one engine start where a config was measured on a cell by several,
    pooled over every successful row measured in rounds (``None``: none was). A row's rounds are one
    start's (its trial's engine); a cached copy adds nothing (:func:`is_cached_copy`). The start contrasts
    are counted per config (k starts: k - 1, however many cells they measured), since a start may shift
    all its cells alike."""
    ok = rows[(rows["status"] == STATUS_OK) & rows["output_throughput"].notna()] if not rows.empty else rows
    measurements: dict[tuple[Any, ...], dict[str, list[float]]] = {}
    starts: dict[Any, set[str]] = {}
    for r in ok.to_dict("records"):
        if is_cached_copy(r):
            continue
        t = r.get("temperature")
        cell = (r.get("engine_key"), r.get("bucket"), r.get("concurrency"), None if _isnull(t) else float(t))
        measurements.setdefault(cell, {}).setdefault(str(r.get("trial_id")), repeat_throughputs(r))
        starts.setdefault(r.get("engine_key"), set()).add(str(r.get("trial_id")))
    return PooledNoise.of_starts([list(m.values()) for m in measurements.values()],
                                 contrasts=sum(len(s) - 1 for s in starts.values()))


def consolidate(ranked: Sequence[Sequence[dict[str, Any]]], noise: PooledNoise | None = None) -> list[dict[str, Any]]:
    """Per bucket one row among those within noise of its best (``ranked[i][0]`` and every row whose
    interval overlaps it), such that as few distinct configs as possible serve all buckets.

    Why: a table that routes bucket A to config X and bucket B to Y because X measured 2 % above Y on
    A costs a second engine for a difference its own rounds cannot tell from noise. Greedy cover: the
    config among the most buckets' ties first (ties -> higher mean log throughput over those buckets,
    then the better-ranked), its row for each of them; then the next, over the buckets left. A bucket
    whose best has no interval (one round, no pooled ``noise``) keeps its best."""
    ties = [[r for r in rows if r is rows[0] or within_noise(r, rows[0], noise)] for rows in ranked]
    chosen: list[dict[str, Any] | None] = [None] * len(ranked)
    left = set(range(len(ranked)))
    while left:
        covers: dict[str, list[dict[str, Any]]] = {}
        for i in sorted(left):
            for r in ties[i]:
                covers.setdefault(r["engine_key"], []).append(r)
        key = max(covers, key=lambda k: (len(covers[k]), sum(map(_log_tput, covers[k])) / len(covers[k])))
        for i in sorted(left):
            row = next((r for r in ties[i] if r["engine_key"] == key), None)
            if row is not None:
                chosen[i] = row
                left.discard(i)
    return [r for r in chosen if r is not None]


def _describe(row: Mapping[str, Any]) -> str:
    return f"{row['engine_label']} ({float(row['output_throughput']):,.0f} tok/s)"


def gains_over(figures: BucketFigures, baselines: Mapping[str, BucketFigures]) -> dict[str, float]:
    """Relative output-throughput gain of ``figures`` over each baseline (0.15 = +15 %)."""
    return {k: figures.output_throughput / v.output_throughput - 1.0
            for k, v in baselines.items() if v.output_throughput > 0}


#: A cell's config must beat the one it replaces by more than this (the noise floor of figures measured
#: once, whose confidence intervals have no width); the replica plan holds several configs to it too.
CELL_MIN_GAIN = 0.03

CELL_DROPPED = "GPU(s); dropped"
"""How the budget-fitting step's note on a dropped cell ends. A replica plan made afterwards re-decides
every part of the mix from all measured configs, so its own notes supersede these
(:func:`tuning.sweep.choose.plan_replicas` leaves them out)."""


def pick_best(
    results: pd.DataFrame,
    buckets: Sequence[Bucket],
    constraints: Constraints = Constraints(),
    *,
    provenance: Provenance,
    budget: GpuBudget | None = None,
    cell_min_gain: float = CELL_MIN_GAIN,
) -> RoutingTable:
    """Per bucket, the config with the highest measured output throughput at the bucket's primary load
    among successful rows that meet ``constraints``; its figures; both baselines' figures and the
    gains over them; a load variant for each higher concurrency level where another config wins.

    Buckets measured at several temperatures get cells instead of load variants
    (:func:`tuning.cells.choose_cells`): every other (sampling band, concurrency) whose best config beats
    the one it would otherwise get beyond the noise and by more than ``cell_min_gain``; cells that do not
    fit the budget are dropped, least gain first. The noise: one round's, pooled over every row measured
    in rounds (:func:`pooled_noise`); two configs differ where the interval of their ratio excludes 1.
    A cell left on the bucket's config because its comparison was within noise is named in
    ``provenance.notes`` with the rounds that would decide it: a second sweep may decide it otherwise.

    With a ``budget`` the table must also be servable on ``budget.gpus`` GPUs (one replica of every
    engine it uses, sharing per ``budget.share_gpu``): the per-bucket best when that fits; else the
    fitting combination of each bucket's top candidates that maximises the sweep's scalar objective
    (:func:`_fit_primaries`). Load variants are then kept while they fit, else replaced by the next
    config that beats the bucket's own at that load and fits, else dropped. What the budget changed
    is written to ``provenance.gpu_budget.notes``.

    Pure: no files, no clock. Raises :class:`IncompleteResultsError` naming what is missing when a
    bucket has no eligible successful row or a baseline has no successful row for a bucket, or when
    no combination fits the budget.
    """
    problems: list[str] = []
    if results.empty:
        raise IncompleteResultsError("the sweep produced no results; nothing to route by (previous table kept)")
    ok = results[(results["status"] == STATUS_OK) & results["output_throughput"].notna()]
    found: list[tuple[Bucket, dict[str, BucketFigures], list[dict[str, Any]], pd.DataFrame]] = []
    for b in buckets:
        at_bucket = ok[ok["bucket"] == b.name]
        at_t = _at_temperature(at_bucket, b.primary_temperature)
        primary = at_t[at_t["concurrency"] == b.primary_concurrency]
        baselines: dict[str, BucketFigures] = {}
        for role, key in BASELINE_ROLES.items():
            base = _best_row(primary[primary["role"] == role])
            if base is None:
                problems.append(f"bucket {b.name}: baseline {key!r} ({role}) has no successful measurement")
            else:
                baselines[key] = _figures(base)
        ranked = _ranked(primary[constraints.mask(primary)] if not primary.empty else primary)
        if not ranked:
            why = "no successful trial" if primary.empty else f"no successful trial meets {constraints.to_dict()}"
            problems.append(f"bucket {b.name}: {why}")
            continue
        found.append((b, baselines, ranked, at_bucket))
    if problems:
        raise IncompleteResultsError(
            "the sweep's results are incomplete, so no routing table was written and any previous table is "
            "kept:\n  - " + "\n  - ".join(problems)
            + "\nResume the sweep (--resume RUN_DIR) with a larger --num-trials/--time-budget-s, relax the "
            "constraints, or check the failure reasons in results.csv."
        )

    # Called different only when their intervals say so: within noise of its best, a bucket takes the
    # config that serves the most buckets (when no row of the sweep has rounds: the point figure decides).
    noise = pooled_noise(results)
    unconstrained = consolidate([ranked for _, _, ranked, _ in found], noise)
    chosen = unconstrained
    notes: list[str] = []
    if budget is not None and not budget.fits(_engine(r) for r in {r["engine_key"]: r for r in chosen}.values()):
        fitted = _fit_primaries([ranked for _, _, ranked, _ in found], budget)
        if fitted is None:
            raise IncompleteResultsError(_no_fit_message(found, budget))
        chosen = fitted
        for (b, *_), best, row in zip(found, unconstrained, chosen):
            if row["engine_key"] != best["engine_key"]:
                notes.append(f"{b.name}: {_describe(row)} instead of {_describe(best)} "
                             f"({float(row['output_throughput']) / float(best['output_throughput']) - 1:+.1%})")
        if notes:
            ratio = math.exp((sum(map(_log_tput, chosen)) - sum(map(_log_tput, unconstrained))) / len(chosen))
            notes.insert(0, f"the best config per bucket needs {_gpus_of(unconstrained, budget)} GPUs, over the "
                            f"budget of {budget.gpus}; this table's geometric-mean output throughput over the "
                            f"buckets is {ratio - 1:+.1%} against it")
    within = [f"{b.name}: {_describe(row)} serves it, within noise of {_describe(ranked[0])} "
              f"({float(row['output_throughput']) / float(ranked[0]['output_throughput']) - 1:+.1%}; "
              + ("the interval of their ratio holds 1 at the pooled noise)" if noise else
                 f"intervals over {len(repeat_throughputs(row))} rounds overlap)")
              for (b, _, ranked, _), row in zip(found, chosen)
              if row["engine_key"] != ranked[0]["engine_key"] and within_noise(row, ranked[0], noise)]
    if noise is not None:
        within.insert(0, f"noise: {noise.describe()} over the sweep's measurements; two configs are called "
                         "different where the 95 % interval of their throughput ratio excludes 1")
    placed = {r["engine_key"]: _engine(r) for r in chosen}
    routes = []
    for (b, baselines, _, at_bucket), row in zip(found, chosen):
        figures = _figures(row)
        gains = gains_over(figures, baselines)
        variants = []
        cells: tuple[Cell, ...] = ()
        if len(b.temperatures) > 1:
            choice = _cells(b, at_bucket, row["engine_key"], constraints, cell_min_gain, noise)
            cells = choice.cells
            within.extend(f"{b.name} {n}" for n in choice.notes)  # an undecided cell: a second sweep may differ
        for c in b.concurrency_levels[1:] if len(b.temperatures) == 1 else ():
            at_c = _at_temperature(at_bucket, b.primary_temperature)
            at_c = at_c[at_c["concurrency"] == c]
            ranked_c = _ranked(at_c[constraints.mask(at_c)] if not at_c.empty else at_c)
            vrow = _load_variant(ranked_c, row["engine_key"], placed, budget)
            if vrow is not None:
                variants.append(LoadVariant(min_concurrency=c, config=config_of_row(vrow), figures=_figures(vrow)))
            wanted = ranked_c[0] if ranked_c and ranked_c[0]["engine_key"] != row["engine_key"] else None
            if wanted is not None and (vrow or {}).get("engine_key") != wanted["engine_key"]:  # the budget's doing
                notes.append(f"{b.name} at >= {c} in flight: {_describe(wanted)} does not fit; "
                             + (f"{_describe(vrow)} instead" if vrow is not None else "no load variant"))
        routes.append(BucketRoute(
            name=b.name, max_output_len=b.max_output_len, config=config_of_row(row), figures=figures,
            baselines=baselines, gains=gains, load_variants=tuple(variants), cells=cells,
            workload=b.workload.to_dict(),
        ))
    if budget is not None:
        routes, dropped = _fit_cells(routes, budget)
        notes.extend(dropped)
    update: dict[str, Any] = {"constraints": constraints.to_dict(), "notes": tuple(within)}
    if budget is not None:
        update["gpu_budget"] = budget.model_copy(update={"notes": tuple(notes)})
    return RoutingTable(provenance=provenance.model_copy(update=update), buckets=tuple(routes),
                        default_max_tokens=buckets[0].max_output_len)


def _at_temperature(df: pd.DataFrame, temperature: float) -> pd.DataFrame:
    """Rows measured at ``temperature`` (rows from before the column stand for the primary one)."""
    if "temperature" not in df.columns:
        return df
    t = pd.to_numeric(df["temperature"], errors="coerce")
    return df[t.isna() | (t == temperature)]


def measured_at_primary(results: pd.DataFrame, b: Bucket, engine_key: str) -> tuple[dict[str, Any], BucketFigures] | None:
    """``engine_key``'s config and figures at bucket ``b``'s primary cell (its primary load and
    temperature), from the successful rows of ``results``; ``None`` where it was not measured there."""
    ok = results[(results["status"] == STATUS_OK) & (results["engine_key"] == engine_key)
                 & (results["bucket"] == b.name)]
    at = _at_temperature(ok, b.primary_temperature)
    row = _best_row(at[at["concurrency"] == b.primary_concurrency])
    return None if row is None else (config_of_row(row), _figures(row))


def cell_measurements(rows: pd.DataFrame, b: Bucket) -> list[Any]:
    """Bucket ``b``'s successful rows as :class:`tuning.cells.CellMeasurement` s: one per config x
    sampling band x concurrency, every repeat's throughput a sample and every measuring trial an engine
    start (rows from before the temperature column stand for the bucket's primary temperature; a cached
    copy of a row, :func:`is_cached_copy`, is not counted again)."""
    from tuning.cells import CellMeasurement

    samples: dict[tuple[str, str, int], dict[str, list[float]]] = {}
    configs: dict[str, dict[str, Any]] = {}
    accept: dict[tuple[str, str, int], float] = {}
    rows = rows[(rows["bucket"] == b.name) & (rows["status"] == STATUS_OK) & rows["output_throughput"].notna()]
    for row in rows.to_dict("records"):
        t = row.get("temperature")
        t = b.primary_temperature if _isnull(t) else float(t)
        band = routing.band_of(t)
        if band is None:
            continue
        if is_cached_copy(row):
            continue
        k = (str(row["engine_key"]), band.name, int(row["concurrency"]))
        samples.setdefault(k, {}).setdefault(str(row["trial_id"]), []).extend(repeat_throughputs(row))
        configs[k[0]] = config_of_row(row)
        if not _isnull(row.get("accept_length")):
            accept[k] = float(row["accept_length"])
    return [CellMeasurement(config=configs[key], bucket=b.name, band=band, in_flight=c,
                            throughputs=tuple(x for rounds in starts.values() for x in rounds),
                            rounds_per_start=tuple(len(rounds) for rounds in starts.values()),
                            accept_length=accept.get((key, band, c)))
            for (key, band, c), starts in samples.items() if any(starts.values())]


def _cells(b: Bucket, at_bucket: pd.DataFrame, primary_key: str, constraints: Constraints,
           min_gain: float, noise: PooledNoise | None = None) -> Any:
    """The bucket's :class:`tuning.cells.BucketChoice` from its rows at every (temperature, concurrency):
    its cells, why others were not written (notes) and the comparisons left within noise."""
    from tuning.cells import choose_cells

    eligible = at_bucket[constraints.mask(at_bucket)] if not at_bucket.empty else at_bucket
    measured = cell_measurements(eligible, b)
    primary_band = routing.band_of(b.primary_temperature)
    assert primary_band is not None
    return choose_cells(measured, primary_band=primary_band.name, primary_in_flight=b.primary_concurrency,
                        min_gain=min_gain, primary_keys={b.name: primary_key}, noise=noise)[b.name]


def undecided_cells(results: pd.DataFrame, buckets: Sequence[Bucket], table: RoutingTable,
                    constraints: Constraints = Constraints()) -> list[Undecided]:
    """The cell comparisons of ``table`` (chosen from ``results``) left within noise
    (:class:`tuning.cells.Undecided`), against each bucket's primary as the table routes it and at the noise
    pooled over ``results``, as :func:`pick_best` decided them."""
    ok = results[(results["status"] == STATUS_OK) & results["output_throughput"].notna()]
    noise = pooled_noise(results)
    return [u for b in buckets if len(b.temperatures) > 1
            for u in _cells(b, ok[ok["bucket"] == b.name], table.bucket(b.name).engine_config().key(), constraints,
                            CELL_MIN_GAIN, noise).undecided]


def _fit_cells(routes: list[BucketRoute], budget: GpuBudget) -> tuple[list[BucketRoute], list[str]]:
    """Drop cells, least gain first, until one replica of every engine fits the budget."""
    notes: list[str] = []

    def configs() -> list[EngineConfig]:
        return list({c.key(): c for r in routes for c in r.engine_configs()}.values())

    while not budget.fits(configs()):
        candidates = [(c.gain() if c.gain() is not None else 0.0, i, j) for i, r in enumerate(routes)
                      for j, c in enumerate(r.cells)]
        if not candidates:
            break
        _, i, j = min(candidates)
        cell = routes[i].cells[j]
        notes.append(f"{routes[i].name} cell {cell.sampling}@{cell.min_in_flight}: "
                     f"{cell.engine_config().label()} does not fit {budget.gpus} {CELL_DROPPED}")
        routes[i] = routes[i].model_copy(update={"cells": routes[i].cells[:j] + routes[i].cells[j + 1:]})
    return routes, notes


def _gpus_of(rows: Sequence[Mapping[str, Any]], budget: GpuBudget) -> int:
    """GPUs one engine per distinct config of ``rows`` takes under the budget's sharing."""
    return routing.gpus_for_engines({r["engine_key"]: _engine(r) for r in rows}.values(), share_gpu=budget.share_gpu)


def _no_fit_message(found: Sequence[tuple[Bucket, Any, Sequence[Mapping[str, Any]], Any]], budget: GpuBudget) -> str:
    best = [ranked[0] for _, _, ranked, _ in found]
    smallest = min((r for _, _, ranked, _ in found for r in ranked[:BUDGET_CANDIDATES]),
                   key=lambda r: _engine(r).gpu_request(share_gpu=budget.share_gpu))
    shareable = any(_engine(r).tp == 1 for _, _, ranked, _ in found for r in ranked)
    return (
        f"no routing table of the measured configs fits {budget.gpus} GPU(s)"
        f"{' with tp=1 engines sharing GPUs' if budget.share_gpu else ''}, so no routing table was written and "
        f"any previous table is kept: the best config per bucket needs {_gpus_of(best, budget)} GPUs and no "
        f"combination of each bucket's top {BUDGET_CANDIDATES} eligible configs fits (the smallest, "
        f"{smallest['engine_label']}, reserves {_engine(smallest).gpu_request(share_gpu=budget.share_gpu):g} GPUs "
        f"alone).\nRaise --serve-gpus, "
        + ("let tp=1 engines share GPUs (--share-gpu), " if shareable and not budget.share_gpu else "")
        + ("or sweep smaller memory fractions." if budget.share_gpu else "or sweep a lower --tp.")
    )


def commit_table(table: RoutingTable, path: str | Path) -> RoutingTable:
    """Atomically commit (``orchestrator.table.commit``); returns the table as written (with its version)."""
    return routing.commit(table, path)


def summary_rows(table: RoutingTable) -> list[dict[str, Any]]:
    """Per bucket: label of the chosen config, throughput, gains (for the CLI's summary table)."""
    out = []
    for b in table.buckets:
        cfg = b.engine_config()
        out.append({
            "bucket": b.name, "config": cfg.label(), "output_throughput": b.figures.output_throughput,
            "accept_length": b.figures.accept_length,
            "gain_vs_mtp_off": b.gains.get("mtp_off"), "gain_vs_static": b.gains.get("static"),
            "load_variants": [f">={v.min_concurrency}: {v.engine_config().label()}" for v in b.load_variants]
            + [f"{c.sampling or 'any'} >={c.min_in_flight}: {c.engine_config().label()}" for c in b.cells],
        })
    return out


ROLE_NAMES = {ROLE_MTP_OFF: "MTP off", ROLE_STATIC: "static recommendation"}
