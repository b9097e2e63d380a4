"""What a trial returns: typed result rows and the trial's report, and their copy in the run dir.

A trial hands Tune only its objective figures (:meth:`TrialReport.metrics`); its rows stay typed
(:class:`ResultRow`) and travel in the :class:`TrialReport` it saves to ``<run_dir>/trial-results``
before reporting. The sweep builds its results frame from those reports: no rows go through Tune's
result logging (which would have to serialise them into one string and parse it back).

The saved report is also what lets a resumed sweep re-report a trial whose result reached the run dir
(and the Optuna study) but not Tune's experiment state before the driver died.
"""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.fsutil import atomic_write_text
from tuning.buckets import Bucket
from tuning.results import STATUS_OK

__all__ = ["FAILED_SCORE", "REPORTED_DIR", "ResultRow", "TrialReport", "metric_name", "reported_trial_ids"]

REPORTED_DIR = "trial-results"

FAILED_SCORE = math.log(1e-3)
"""Scalar objective of a failed trial: log of a near-zero throughput (finite so TPE can use it)."""


def metric_name(bucket: str) -> str:
    """Per-bucket objective metric reported to Tune/Optuna (output tokens/s at the primary load)."""
    return f"tput_{bucket}"


@dataclass(frozen=True)
class ResultRow:
    """One trial x bucket x concurrency: the columns of :data:`tuning.results.ROW_COLUMNS`, plus where a
    real engine was measured (:func:`orchestrator.hostinfo.measured_on`) and, for a cached copy, the
    trial that measured it."""

    sweep_id: str
    trial_id: str
    role: str
    status: str
    bucket: str
    failure_reason: str | None = None
    cached: bool = False
    max_output_len: int | None = None
    concurrency: int | None = None
    temperature: float | None = None
    sampling_band: str | None = None
    primary_load: bool | None = None
    engine_key: str | None = None
    engine_label: str | None = None
    backend: str | None = None
    engine: str | None = None
    model: str | None = None
    tp: int | None = None
    speculative: bool | None = None
    num_draft_tokens: int | None = None
    memory_fraction: float | None = None
    max_batch_size: int | None = None
    session_len: int | None = None
    max_prefill_tokens: int | None = None
    extra_flags: str | None = None
    simulated_backend: str | None = None
    output_throughput: float | None = None
    request_throughput: float | None = None
    input_throughput: float | None = None
    total_token_throughput: float | None = None
    ttft_ms_mean: float | None = None
    ttft_ms_median: float | None = None
    ttft_ms_p99: float | None = None
    tpot_ms_mean: float | None = None
    tpot_ms_median: float | None = None
    tpot_ms_p99: float | None = None
    itl_ms_mean: float | None = None
    itl_ms_median: float | None = None
    itl_ms_p99: float | None = None
    e2e_ms_mean: float | None = None
    e2e_ms_median: float | None = None
    e2e_ms_p99: float | None = None
    accept_length: float | None = None
    completed: int | None = None
    failed_requests: int | None = None
    duration_s: float | None = None
    early_stopped: bool | None = None
    simulated: bool | None = None
    time_scale: float | None = None
    started_at: str | None = None
    finished_at: str | None = None
    output_throughput_repeats: str | None = None
    output_throughput_spread: float | None = None
    host_cpu_busy_max: float | None = None
    sim_lag_share_max: float | None = None
    engine_startup_s: float | None = None
    workload: str | None = None
    # Only in some rows (left out of the dict when unset, so the results frame has no empty column).
    cached_from_trial: str | None = None
    gpu_type: str | None = None
    engine_version: str | None = None
    lmdeploy_version: str | None = None
    """Rows written before ``engine_version``: read, never written."""
    cpu_model: str | None = None
    cpus: int | None = None

    OPTIONAL = ("cached_from_trial", "gpu_type", "engine_version", "lmdeploy_version", "cpu_model", "cpus")

    @classmethod
    def from_mapping(cls, row: Mapping[str, Any]) -> ResultRow:
        """A row from a :func:`tuning.results.rows_for_trial` dict (or a saved one); an unknown column is
        a programming error, refused with its name."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(row) - known)
        if unknown:
            raise ConfigError(f"unknown result column(s) {unknown}; known: {sorted(known)}")
        return cls(**dict(row))

    def replace(self, **changes: Any) -> ResultRow:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in self.OPTIONAL:
            if d[k] is None:
                del d[k]
        return d


@dataclass(frozen=True)
class TrialReport:
    """A finished trial: its outcome, its rows, and the objective figures the searcher learns from."""

    status: str
    role: str
    rows: tuple[ResultRow, ...]
    failure_reason: str = ""
    cached: bool = False
    engine_key: str | None = None
    engine_label: str | None = None
    engine_started: bool = False
    bucket_throughput: Mapping[str, float] = field(default_factory=dict)
    score: float = FAILED_SCORE

    @classmethod
    def build(cls, rows: Iterable[ResultRow], buckets: Sequence[Bucket], *, status: str, failure: str, role: str,
              engine_key: str | None, engine_label: str | None, cached: bool, engine_started: bool) -> TrialReport:
        """The report of ``rows``: each bucket's primary-load throughput (0 when it failed) and the
        scalar score, the mean over buckets of its log (a failed bucket counts :data:`FAILED_SCORE`)."""
        rows = tuple(rows)
        tputs: dict[str, float] = {}
        for b in buckets:
            tput = 0.0
            for r in rows:
                if r.bucket == b.name and r.primary_load and r.status == STATUS_OK:
                    tput = float(r.output_throughput or 0.0)
            tputs[b.name] = tput
        logs = [math.log(t) if t > 0 else FAILED_SCORE for t in tputs.values()]
        return cls(status=status, role=role, rows=rows, failure_reason=failure, cached=cached,
                   engine_key=engine_key, engine_label=engine_label, engine_started=engine_started,
                   bucket_throughput=tputs, score=sum(logs) / len(logs) if logs else FAILED_SCORE)

    def metrics(self) -> dict[str, Any]:
        """What the trial reports to Tune (and the searcher tells Optuna): no rows."""
        out: dict[str, Any] = {"status": self.status, "failure_reason": self.failure_reason, "role": self.role,
                               "cached": self.cached, "engine_key": self.engine_key,
                               "engine_label": self.engine_label, "engine_starts": int(self.engine_started)}
        out.update({metric_name(b): t for b, t in self.bucket_throughput.items()})
        out["score"] = self.score
        return out

    # ----- the run dir's copy -------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps({**self.metrics(), "bucket_throughput": dict(self.bucket_throughput),
                           "rows": [r.to_dict() for r in self.rows]}, default=str)

    @classmethod
    def from_json(cls, text: str) -> TrialReport:
        d = json.loads(text)
        # Run dirs written before typed rows kept them as one JSON string.
        raw_rows = d["rows"] if "rows" in d else json.loads(d["rows_json"])
        tputs = d.get("bucket_throughput") or {k.removeprefix("tput_"): float(v) for k, v in d.items()
                                                if k.startswith("tput_")}
        return cls(status=d["status"], role=d["role"], rows=tuple(ResultRow.from_mapping(r) for r in raw_rows),
                   failure_reason=d.get("failure_reason") or "", cached=bool(d.get("cached")),
                   engine_key=d.get("engine_key"), engine_label=d.get("engine_label"),
                   engine_started=bool(d.get("engine_starts")), bucket_throughput=tputs,
                   score=float(d.get("score", FAILED_SCORE)))

    def save(self, run_dir: str | Path, trial_id: str) -> None:
        """Keep the report in the run dir (atomically) before handing it to Tune: the driver can die
        after the searcher recorded it but before Tune's experiment state did, and a resumed sweep
        must then re-report it, not measure it again (:meth:`load`)."""
        d = Path(run_dir) / REPORTED_DIR
        d.mkdir(parents=True, exist_ok=True)
        atomic_write_text(d / f"{trial_id}.json", self.to_json())

    @classmethod
    def load(cls, run_dir: str | Path, trial_id: str) -> TrialReport | None:
        """What trial ``trial_id`` reported, if it got that far (``None`` otherwise, also for a torn file)."""
        try:
            return cls.from_json((Path(run_dir) / REPORTED_DIR / f"{trial_id}.json").read_text())
        except (OSError, ValueError, KeyError, TypeError):
            return None


def reported_trial_ids(run_dir: str | Path) -> list[str]:
    """The trials whose report reached the run dir (:meth:`TrialReport.load`), sorted."""
    return sorted(p.stem for p in (Path(run_dir) / REPORTED_DIR).glob("*.json"))
