"""Sweep results as a table: the row schema and its I/O.

One row per trial x bucket x concurrency x temperature (see :data:`ROW_COLUMNS`). Trials produce rows
(:func:`rows_for_trial`), the sweep collects them into a DataFrame (:func:`results_frame`) and writes it
(:func:`write_results`). Turning the rows into a routing table is :mod:`tuning.choose`'s business: it
imports this module, never the reverse.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from orchestrator import table as routing
from orchestrator.config import EngineConfig
from tuning.buckets import Bucket

__all__ = [
    "BUSY_HOST_SHARE",
    "CONFIG_COLUMNS",
    "FIGURE_COLUMNS",
    "ROW_COLUMNS",
    "STATUS_FAILED",
    "STATUS_OK",
    "behind_schedule_rows",
    "bench_status",
    "busy_host_rows",
    "config_columns",
    "config_of_row",
    "failed_rows",
    "figure_columns",
    "is_cached_copy",
    "primary_rows",
    "repeat_throughputs",
    "results_frame",
    "rows_for_trial",
    "successful_primary_rows",
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


