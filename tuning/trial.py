"""One trial: start one engine for one config, measure every bucket (and load level), stop it, report.

Engine start-up dominates a trial (60-170 s for LMDeploy on an H200), so one start serves all
buckets. A failure of the engine (crash, OOM, hang) is a *result*: the trial reports
``status="failed"`` with the reason and a zero throughput per bucket, so the searcher learns the
config is bad and the sweep goes on; nothing is raised to Tune (which would retry or mark it
errored).

Configs that render the same engine command (same :meth:`EngineConfig.key`) are measured once per
sweep: :class:`ResultCache` (a named Ray actor owned by the sweep driver) hands a second trial the
first one's rows, marked ``cached``; a trial whose twin is still running waits for it.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config import Backend, EngineConfig
from orchestrator.errors import ConfigError, EngineError, OrchestratorError
from tuning.buckets import Bucket
from tuning.results import STATUS_FAILED, STATUS_OK, failed_rows, rows_for_trial
from tuning.space import ROLE_SEARCH, SearchSpace

__all__ = ["TrialContext", "ResultCache", "GpuMeasureLease", "measure_config", "run_trial", "trial_metrics",
           "metric_name", "FAILED_SCORE"]

logger = logging.getLogger(__name__)

FAILED_SCORE = math.log(1e-3)
"""Scalar objective of a failed trial: log of a near-zero throughput (finite so TPE can use it)."""


def metric_name(bucket: str) -> str:
    """Per-bucket objective metric reported to Tune/Optuna (output tokens/s at the primary load)."""
    return f"tput_{bucket}"


@dataclass(frozen=True)
class TrialContext:
    """Everything a trial needs besides its point; the same for every trial of a sweep.

    Args:
        sweep_id: id written into every row.
        run_dir: the sweep's folder (engine logs go to ``<run_dir>/engine-logs``).
        space: turns the trial's point into an :class:`EngineConfig`.
        buckets: what to measure.
        sim_time_scale: simulator ``--time-scale`` (sim only).
        steady_state: ``SteadyStateRule`` kwargs, or ``None`` to run every request to completion.
        steady_state_min_output_len: the rule applies to buckets at least this long (short buckets
            finish fast, and their ramp-up/down is part of what a client sees).
        cache_actor: name of the :class:`ResultCache` actor (``None``: no dedupe, e.g. outside Ray).
        ready_timeout_s: how long an engine may take to answer ``/v1/models``.
        request_timeout_s: per-request timeout of the bench client.
        tokenizer: tokenizer path for LMDeploy workloads (``None``: the bench's default counter).
        measure_lease_actor: name of the sweep's :class:`GpuMeasureLease` actor when engines share
            GPUs (``None``: each trial owns its GPUs and measures whenever it is ready).
    """

    sweep_id: str
    run_dir: str
    space: SearchSpace
    buckets: tuple[Bucket, ...]
    sim_time_scale: float | None = None
    steady_state: Mapping[str, Any] | None = field(default_factory=lambda: {"rel_tolerance": 0.02})
    steady_state_min_output_len: int = 4096
    cache_actor: str | None = None
    cache_namespace: str | None = None
    ready_timeout_s: float = 900.0
    request_timeout_s: float = 3600.0
    tokenizer: str | None = None
    measure_lease_actor: str | None = None


def measure_config(
    config: EngineConfig,
    buckets: Sequence[Bucket],
    *,
    log_dir: str | Path,
    gpus: Sequence[int] | None = None,
    sim_time_scale: float | None = None,
    steady_state: Mapping[str, Any] | None = None,
    steady_state_min_output_len: int = 4096,
    ready_timeout_s: float = 900.0,
    request_timeout_s: float = 3600.0,
    tokenizer: Any = None,
    measure_guard: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
) -> tuple[dict[tuple[str, int], dict[str, Any]], str, float | None]:
    """Start one engine, run every bucket x load level against it, stop it.

    ``measure_guard`` is entered after the engine is ready and held while it is measured (engines
    sharing a GPU: start side by side, measure one at a time).

    Returns ``(measurements, failure, startup_s)``: ``BenchResult`` dicts by (bucket, concurrency),
    the reason the engine failed ('' if it did not), and the engine's start-up time in seconds.
    """
    from orchestrator.engine import EngineProcess
    from tuning.bench import SteadyStateRule

    rule = SteadyStateRule(**steady_state) if steady_state else None
    is_sim = config.backend is Backend.SIM
    engine = EngineProcess(config, gpus=None if is_sim else gpus, log_dir=log_dir,
                           ready_timeout_s=ready_timeout_s, sim_time_scale=sim_time_scale if is_sim else None)
    measurements: dict[tuple[str, int], dict[str, Any]] = {}
    startup_s: float | None = None
    try:
        t0 = time.monotonic()
        try:
            engine.start()
            engine.wait_until_ready()
        except (EngineError, OrchestratorError) as e:
            return measurements, _reason("engine failed to start", e), None
        startup_s = time.monotonic() - t0
        if is_sim and sim_time_scale:
            startup_s *= sim_time_scale  # simulated seconds, like every other sim figure
        with measure_guard() if measure_guard is not None else contextlib.nullcontext():
            failure = _measure_buckets(engine, config, buckets, rule=rule, measurements=measurements,
                                       steady_state_min_output_len=steady_state_min_output_len,
                                       request_timeout_s=request_timeout_s, tokenizer=tokenizer)
        return measurements, failure, startup_s
    finally:
        engine.stop()


def _measure_buckets(engine: Any, config: EngineConfig, buckets: Sequence[Bucket], *, rule: Any,
                     measurements: dict[tuple[str, int], dict[str, Any]], steady_state_min_output_len: int,
                     request_timeout_s: float, tokenizer: Any) -> str:
    """Every bucket x load level against the ready ``engine`` into ``measurements``; returns the
    failure reason ('' when all ran)."""
    from tuning.bench import benchmark

    for b in buckets:
        for c in b.concurrency_levels:
            bucket_rule = rule if b.max_output_len >= steady_state_min_output_len else None
            try:
                result = benchmark(engine.base_url, b.workload_at(c), engine_config=config,
                                   steady_state=bucket_rule, request_timeout_s=request_timeout_s,
                                   tokenizer=tokenizer)
                measurements[(b.name, c)] = result.to_dict()
                engine.check_health()
            except EngineError as e:
                return _reason(f"engine failed during bucket {b.name} (concurrency {c})", e)
            except OrchestratorError as e:  # bench could not run at all (server unreachable...)
                if not engine.is_alive():
                    return _reason(f"engine died during bucket {b.name}", e)
                return _reason(f"benchmark of bucket {b.name} failed", e)
    return ""


def _reason(prefix: str, e: BaseException, limit: int = 1500) -> str:
    """The failure as one bounded string. When too long, the middle goes: the head says what failed,
    the tail holds the engine's last log lines (the OOM or traceback that says why)."""
    text = f"{prefix}: {type(e).__name__}: {e}"
    if len(text) <= limit:
        return text
    head = limit // 2
    return text[:head] + " [...] " + text[len(text) - (limit - head - 7):]


def trial_metrics(rows: Sequence[Mapping[str, Any]], buckets: Sequence[Bucket], *, status: str, failure: str,
                  role: str, config: EngineConfig | None, cached: bool, engine_started: bool) -> dict[str, Any]:
    """What a trial reports to Tune: per-bucket objectives, a scalar score, and its rows as JSON."""
    out: dict[str, Any] = {"status": status, "failure_reason": failure, "role": role, "cached": cached,
                           "engine_key": config.key() if config else None,
                           "engine_label": config.label() if config else None,
                           "engine_starts": int(engine_started), "rows_json": json.dumps(rows, default=str)}
    logs = []
    for b in buckets:
        tput = 0.0
        for r in rows:
            if r["bucket"] == b.name and r.get("primary_load") and r["status"] == STATUS_OK:
                tput = float(r.get("output_throughput") or 0.0)
        out[metric_name(b.name)] = tput
        logs.append(math.log(tput) if tput > 0 else FAILED_SCORE)
    out["score"] = sum(logs) / len(logs) if logs else FAILED_SCORE
    return out


# ----- Ray pieces -----------------------------------------------------------------------------------------
class ResultCache:
    """Rows by engine key for one sweep (a Ray actor: trials on any node share it).

    ``claim(key, trial_id)`` answers ``("run", None)`` (caller measures, then ``put``s),
    ``("cached", rows)`` or ``("wait", None)`` while another trial measures the same key.
    """

    def __init__(self, seed: Mapping[str, list[dict[str, Any]]] | None = None) -> None:
        self._rows: dict[str, list[dict[str, Any]]] = {k: list(v) for k, v in (seed or {}).items()}
        self._running: dict[str, str] = {}

    def claim(self, key: str, trial_id: str) -> tuple[str, list[dict[str, Any]] | None]:
        if key in self._rows:
            return "cached", self._rows[key]
        owner = self._running.get(key)
        if owner is not None and owner != trial_id:
            return "wait", None
        self._running[key] = trial_id
        return "run", None

    def put(self, key: str, rows: list[dict[str, Any]]) -> None:
        self._rows[key] = rows
        self._running.pop(key, None)

    def release(self, key: str) -> None:
        self._running.pop(key, None)

    def keys(self) -> list[str]:
        return sorted(self._rows)


class GpuMeasureLease:
    """Which trial may measure on each GPU now (a Ray actor, one per sweep run with ``--share-gpu``).

    Engines that share a GPU start side by side, but a figure taken while another engine on the same
    GPU serves load would measure the neighbour too; so measuring takes a lease per GPU. The lease
    expires ``ttl_s`` after its holder last renewed it (:func:`measure_lease` renews in a thread), so
    a trial that dies while holding it blocks the GPU for ``ttl_s`` at most, never for good.
    """

    def __init__(self, ttl_s: float = 30.0) -> None:
        self._ttl_s = ttl_s
        self._held: dict[str, tuple[str, float]] = {}

    def try_acquire(self, gpu: str, holder: str) -> bool:
        """Take (or renew) ``gpu``'s lease for ``holder``; ``False`` while someone else holds it."""
        now = time.monotonic()
        current = self._held.get(gpu)
        if current is not None and current[0] != holder and current[1] > now:
            return False
        self._held[gpu] = (holder, now + self._ttl_s)
        return True

    def release(self, gpu: str, holder: str) -> None:
        if self._held.get(gpu, ("", 0.0))[0] == holder:
            del self._held[gpu]

    def holders(self) -> dict[str, str]:
        now = time.monotonic()
        return {gpu: h for gpu, (h, until) in self._held.items() if until > now}


@contextlib.contextmanager
def measure_lease(lease: Any, gpus: Sequence[str], holder: str, *, poll_s: float = 0.5,
                  renew_s: float = 5.0) -> Iterator[None]:
    """Hold the measurement lease of every GPU in ``gpus`` (a :class:`GpuMeasureLease` actor handle)
    for the ``with`` body. All or none: a partial hold is given back before waiting again, so two
    trials can never each hold half of what the other needs."""
    import ray

    gpus = sorted(gpus)
    while True:
        got = [g for g in gpus if ray.get(lease.try_acquire.remote(g, holder))]
        if len(got) == len(gpus):
            break
        for g in got:
            ray.get(lease.release.remote(g, holder))
        time.sleep(poll_s)
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(renew_s):
            for g in gpus:
                try:
                    ray.get(lease.try_acquire.remote(g, holder))
                except Exception:  # noqa: BLE001 - the sweep is ending; the lease expires by itself
                    return

    renewer = threading.Thread(target=renew, name="measure-lease-renew", daemon=True)
    renewer.start()
    try:
        yield
    finally:
        stop.set()
        renewer.join(timeout=renew_s)
        for g in gpus:
            try:
                ray.get(lease.release.remote(g, holder))
            except Exception:  # noqa: BLE001 - actor gone with the sweep
                pass


def _cached_copy(rows: Sequence[Mapping[str, Any]], *, trial_id: str, role: str) -> list[dict[str, Any]]:
    return [{**r, "trial_id": trial_id, "role": role, "cached": True,
             "cached_from_trial": r.get("cached_from_trial") or r.get("trial_id")} for r in rows]


def run_trial(trial_config: dict[str, Any], context: TrialContext) -> None:
    """Tune function trainable (wrap with ``tune.with_parameters(run_trial, context=...)``)."""
    import ray
    from ray import tune

    trial_id = tune.get_context().get_trial_id() or "local"
    role = str(trial_config.get("role") or ROLE_SEARCH)
    buckets = context.buckets
    try:
        config = context.space.config_from_trial_config(trial_config)
    except ConfigError as e:
        rows = failed_rows(sweep_id=context.sweep_id, trial_id=trial_id, role=role, config=None,
                           buckets=buckets, reason=f"invalid config: {e}")
        tune.report(trial_metrics(rows, buckets, status=STATUS_FAILED, failure=str(e), role=role, config=None,
                                  cached=False, engine_started=False))
        return

    key = config.key()
    cache = None
    if context.cache_actor:
        try:
            cache = ray.get_actor(context.cache_actor, namespace=context.cache_namespace)
        except ValueError:
            logger.warning("result cache actor %s not found; measuring without dedupe", context.cache_actor)
    if cache is not None:
        while True:
            verdict, cached_rows = ray.get(cache.claim.remote(key, trial_id))
            if verdict == "cached":
                rows = _cached_copy(cached_rows or [], trial_id=trial_id, role=role)
                failure = next((r["failure_reason"] for r in rows if r.get("failure_reason")), "")
                status = STATUS_OK if any(r["status"] == STATUS_OK for r in rows) else STATUS_FAILED
                tune.report(trial_metrics(rows, buckets, status=status, failure=failure, role=role, config=config,
                                          cached=True, engine_started=False))
                return
            if verdict == "run":
                break
            time.sleep(0.5)

    rows: list[dict[str, Any]] | None = None
    try:
        gpus = [int(g) for g in ray.get_gpu_ids()] if config.backend is not Backend.SIM else None
        log_dir = Path(context.run_dir) / "engine-logs" / trial_id
        guard = None
        if context.measure_lease_actor and gpus:
            lease = ray.get_actor(context.measure_lease_actor, namespace=context.cache_namespace)
            node = ray.get_runtime_context().get_node_id()
            gpu_keys = [f"{node}:{g}" for g in gpus]
            guard = lambda: measure_lease(lease, gpu_keys, trial_id)  # noqa: E731
        measurements, failure, startup_s = measure_config(
            config, buckets, log_dir=log_dir, gpus=gpus, sim_time_scale=context.sim_time_scale,
            steady_state=context.steady_state, steady_state_min_output_len=context.steady_state_min_output_len,
            ready_timeout_s=context.ready_timeout_s, request_timeout_s=context.request_timeout_s,
            tokenizer=_load_tokenizer(context.tokenizer), measure_guard=guard,
        )
        rows = rows_for_trial(sweep_id=context.sweep_id, trial_id=trial_id, role=role, config=config,
                              buckets=buckets, measurements=measurements, failure=failure,
                              engine_startup_s=startup_s)
    except (OrchestratorError, OSError) as e:
        failure = _reason("trial failed", e)
        rows = failed_rows(sweep_id=context.sweep_id, trial_id=trial_id, role=role, config=config,
                           buckets=buckets, reason=failure)
        startup_s = None
    finally:
        if cache is not None:
            if rows is not None:
                ray.get(cache.put.remote(key, rows))
            else:
                ray.get(cache.release.remote(key))
    any_ok = any(r["status"] == STATUS_OK for r in rows)
    status = STATUS_OK if any_ok and not failure else STATUS_FAILED
    if not failure and not any_ok:
        failure = next((r["failure_reason"] for r in rows if r.get("failure_reason")), "no bucket succeeded")
    tune.report(trial_metrics(rows, buckets, status=status, failure=failure, role=role, config=config,
                              cached=False, engine_started=True))


def _load_tokenizer(path: str | None) -> Any:
    if not path:
        return None
    from tuning.workload import load_tokenizer

    return load_tokenizer(path)
