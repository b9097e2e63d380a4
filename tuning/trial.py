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
import functools
import json
import logging
import math
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config import Backend, EngineConfig
from orchestrator.errors import ConfigError, EngineError, OrchestratorError
from tuning.buckets import Bucket
from tuning.budget import check_time_budget
from tuning.results import STATUS_FAILED, STATUS_OK, failed_rows, rows_for_trial
from tuning.space import ROLE_SEARCH, SearchSpace

__all__ = ["TrialContext", "ResultCache", "GpuLease", "measure_lease", "startup_lease", "measure_config",
           "run_trial", "trial_metrics", "metric_name", "FAILED_SCORE"]

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
        measure_lease_actor: name of the sweep's :class:`GpuLease` actor when engines share GPUs
            (start-ups side by side, each measurement alone); ``None``: each trial owns its GPUs,
            starts its engine at once and measures whenever it is ready.
        repeats: runs of each bucket x load level on the same engine (see :func:`measure_config`).
        burn_in: run the first bucket once, unmeasured, before measuring (see :func:`measure_config`).
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
    repeats: int = 1
    burn_in: bool = False


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
    startup_guard: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
    measure_guard: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
    repeats: int = 1,
    burn_in: bool = False,
) -> tuple[dict[tuple[str, int], dict[str, Any]], str, float | None]:
    """Start one engine, run every bucket x load level against it, stop it.

    ``startup_guard`` is entered before the engine starts and left once it is ready or failed;
    ``measure_guard`` is entered after that and held while it is measured (engines sharing a GPU:
    start side by side, measure one at a time, never while a neighbour starts). The two are never
    held together, so a trial waiting for one never holds the other. ``startup_s`` counts from the
    engine's start, not from the wait for ``startup_guard``.

    ``repeats`` > 1 runs each bucket x load level that many times back to back on the same engine
    and keeps the run of median throughput (:func:`representative_run`), with every run's
    throughput beside it: on real GPUs short runs vary, and repeats on one engine tell run-to-run
    noise apart from engine-to-engine differences (another start of the same config).

    ``burn_in`` runs the first bucket's workload once before anything is measured, and discards it:
    on the H200 a fresh engine's first full-load run was the slower one on 7 of 7 engines (1.11x-1.66x;
    the short warm-up requests do not take its place), which biased whichever bucket came first.

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
        try:
            with startup_guard() if startup_guard is not None else contextlib.nullcontext():
                t0 = time.monotonic()
                engine.start()
                engine.wait_until_ready()
                startup_s = time.monotonic() - t0
        except (EngineError, OrchestratorError) as e:
            return measurements, _reason("engine failed to start", e), None
        if is_sim and sim_time_scale:
            startup_s *= sim_time_scale  # simulated seconds, like every other sim figure
        with measure_guard() if measure_guard is not None else contextlib.nullcontext():
            failure = _measure_buckets(engine, config, buckets, rule=rule, measurements=measurements,
                                       steady_state_min_output_len=steady_state_min_output_len,
                                       request_timeout_s=request_timeout_s, tokenizer=tokenizer,
                                       repeats=repeats, burn_in=burn_in)
            # Stopped inside the exclusive hold: a neighbour's measurement never overlaps this
            # engine's teardown, and a neighbour's start-up (which sizes its KV cache from the GPU
            # memory free at that moment) sees this engine's memory already released.
            engine.stop()
        return measurements, failure, startup_s
    finally:
        engine.stop()


def _measure_buckets(engine: Any, config: EngineConfig, buckets: Sequence[Bucket], *, rule: Any,
                     measurements: dict[tuple[str, int], dict[str, Any]], steady_state_min_output_len: int,
                     request_timeout_s: float, tokenizer: Any, repeats: int = 1, burn_in: bool = False) -> str:
    """Every bucket x load level (``repeats`` runs each) against the ready ``engine`` into
    ``measurements``, after one unmeasured run of the first bucket if ``burn_in``; returns the
    failure reason ('' when all ran)."""
    from tuning.bench import benchmark

    # (bucket, concurrency, measured): the burn-in is the first step of the same loop as the
    # buckets, run and not measured, so a failure in either is reported the same way.
    steps: list[tuple[Bucket, int, bool]] = []
    if burn_in and buckets:
        steps.append((buckets[0], buckets[0].primary_concurrency, False))
    steps += [(b, c, True) for b in buckets for c in b.concurrency_levels]
    for b, c, measured in steps:
        what = f"bucket {b.name}" if measured else f"the burn-in run of bucket {b.name}"
        bucket_rule = rule if measured and b.max_output_len >= steady_state_min_output_len else None
        try:
            runs = []
            for _ in range(max(1, repeats) if measured else 1):
                runs.append(benchmark(engine.base_url, b.workload_at(c), engine_config=config,
                                      steady_state=bucket_rule, request_timeout_s=request_timeout_s,
                                      tokenizer=tokenizer).to_dict())
                engine.check_health()
            if measured:
                measurements[(b.name, c)] = representative_run(runs)
        except EngineError as e:
            return _reason(f"engine failed during {what} (concurrency {c})", e)
        except OrchestratorError as e:  # bench could not run at all (server unreachable...)
            if not engine.is_alive():
                return _reason(f"engine died during {what}", e)
            return _reason(f"benchmark of {what} failed", e)
    return ""


def representative_run(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The run that stands for repeated runs of one bucket: one with failed requests if any (a config
    must not win on its good runs), else the lower median by output throughput (with two runs, the
    slower: a table should not pick a config on its luckier run). Carries every run's throughput in
    run order as ``repeat_output_throughputs``."""
    if len(runs) == 1:
        return dict(runs[0])
    failed = [r for r in runs if int(r.get("failed") or 0) > 0]
    ranked = sorted(runs, key=lambda r: float(r.get("output_throughput") or 0.0))
    chosen = failed[0] if failed else ranked[(len(ranked) - 1) // 2]
    return {**chosen, "repeat_output_throughputs": [r.get("output_throughput") for r in runs]}


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


STARTUP = "startup"
"""Lease mode of an engine start-up: shared, many may hold a GPU at once."""
MEASURE = "measure"
"""Lease mode of a measurement: exclusive, alone on its GPUs."""
LEASE_MODES = (STARTUP, MEASURE)


class GpuLease:
    """Who may start an engine or measure on each GPU now: a readers-writer lease per GPU with
    writer preference (a Ray actor, one per sweep run with ``--share-gpu``).

    Engines that share a GPU start side by side (start-up is what a trial pays for), but a figure
    taken while a neighbour on the same GPU serves load *or starts up* (CUDA graph capture, kernel
    warm-up and KV allocation are GPU-heavy; in an H200 sweep start-ups overlapped half the
    measurements) would measure the neighbour too. So:

    - ``startup`` holds are shared, granted while no measurement holds the GPU *and none waits for
      it*: a measurement waits for the start-ups already running, never for new ones;
    - a ``measure`` hold is exclusive, granted while no other holder of either mode holds the GPU; a
      refused one is recorded as waiting (refreshed by the caller's polling), which stops new
      start-ups.

    Several GPUs are taken all or none in one call (an actor runs one call at a time), so two trials
    never each hold half of what the other needs. Every hold and waiting mark expires ``ttl_s`` after
    it was last renewed (:func:`measure_lease` and :func:`startup_lease` renew in a thread; a renewal
    only extends a live hold, never takes one back), so a
    trial that dies blocks a GPU for ``ttl_s`` at most, never for good.
    """

    def __init__(self, ttl_s: float = 30.0) -> None:
        self._ttl_s = ttl_s
        # gpu -> holder -> (mode, until); waiting holds only measurements
        self._held: dict[str, dict[str, tuple[str, float]]] = {}
        self._waiting: dict[str, dict[str, tuple[str, float]]] = {}

    def try_acquire(self, gpus: Sequence[str], holder: str, mode: str = MEASURE) -> bool:
        """Take (or renew) ``holder``'s ``mode`` hold on every GPU in ``gpus``, or on none of them.

        ``False`` while another holder's hold (or, for a start-up, a waiting measurement) is in the
        way; a refused measurement then waits. A live hold of the same holder and mode is always
        renewed (a start-up already running is not stopped by a measurement that waits for it).
        """
        if isinstance(gpus, str):
            raise TypeError("gpus is a sequence of GPU keys, not one key")
        if mode not in LEASE_MODES:
            raise ValueError(f"lease mode must be one of {LEASE_MODES}, got {mode!r}")
        now = time.monotonic()
        self._expire(now)
        until = now + self._ttl_s
        if all(self._may_hold(g, holder, mode) for g in gpus):
            for g in gpus:
                self._held.setdefault(g, {})[holder] = (mode, until)
                self._drop(self._waiting, g, holder)
            return True
        if mode == MEASURE:
            for g in gpus:
                self._waiting.setdefault(g, {})[holder] = (MEASURE, until)
        return False

    def renew(self, gpus: Sequence[str], holder: str, mode: str = MEASURE) -> bool:
        """Extend ``holder``'s live ``mode`` holds on ``gpus``; never grants one or marks a wait. A
        renewal must not take back a hold that lapsed or was released (a late renewal after the
        release, or one after a stall past ``ttl_s``, would otherwise hold a GPU nobody uses).
        ``False`` when any of the holds is gone."""
        now = time.monotonic()
        self._expire(now)
        alive = True
        for g in gpus:
            current = self._held.get(g, {}).get(holder)
            if current is not None and current[0] == mode:
                self._held[g][holder] = (mode, now + self._ttl_s)
            else:
                alive = False
        return alive

    def release(self, gpus: Sequence[str], holder: str, mode: str = MEASURE) -> None:
        """Give back ``holder``'s ``mode`` holds on ``gpus`` (and, for a measurement, its waiting)."""
        for g in gpus:
            if self._held.get(g, {}).get(holder, ("", 0.0))[0] == mode:
                self._drop(self._held, g, holder)
            if mode == MEASURE:
                self._drop(self._waiting, g, holder)

    def holders(self) -> dict[str, dict[str, str]]:
        """Live holds: ``{gpu: {holder: mode}}`` (diagnostics and tests)."""
        self._expire(time.monotonic())
        return {g: {h: mode for h, (mode, _) in held.items()} for g, held in self._held.items()}

    def waiting(self) -> dict[str, list[str]]:
        """Measurements waiting for each GPU: ``{gpu: [holder, ...]}`` (diagnostics and tests)."""
        self._expire(time.monotonic())
        return {g: sorted(w) for g, w in self._waiting.items()}

    def _may_hold(self, gpu: str, holder: str, mode: str) -> bool:
        held = self._held.get(gpu, {})
        if held.get(holder, ("", 0.0))[0] == mode:
            return True  # renewal
        others = [m for h, (m, _) in held.items() if h != holder]
        if mode == MEASURE:
            return not others
        waiters = [h for h in self._waiting.get(gpu, {}) if h != holder]
        return MEASURE not in others and not waiters

    def _expire(self, now: float) -> None:
        for table in (self._held, self._waiting):
            for g in list(table):
                for h in [h for h, (_, until) in table[g].items() if until <= now]:
                    self._drop(table, g, h)

    @staticmethod
    def _drop(table: dict[str, dict[str, tuple[str, float]]], gpu: str, holder: str) -> None:
        entries = table.get(gpu)
        if entries is not None:
            entries.pop(holder, None)
            if not entries:
                del table[gpu]


def measure_lease(lease: Any, gpus: Sequence[str], holder: str, *, poll_s: float = 0.5,
                  renew_s: float = 5.0) -> contextlib.AbstractContextManager[None]:
    """Hold the exclusive ``measure`` lease of every GPU in ``gpus`` (a :class:`GpuLease` actor handle)
    for the ``with`` body: no other engine on those GPUs is measured or starts up meanwhile."""
    return _lease(lease, gpus, holder, MEASURE, poll_s=poll_s, renew_s=renew_s)


def startup_lease(lease: Any, gpus: Sequence[str], holder: str, *, poll_s: float = 0.5,
                  renew_s: float = 5.0) -> contextlib.AbstractContextManager[None]:
    """Hold the shared ``startup`` lease of every GPU in ``gpus`` for the ``with`` body: start-ups run
    side by side, but never while a measurement on those GPUs runs or waits."""
    return _lease(lease, gpus, holder, STARTUP, poll_s=poll_s, renew_s=renew_s)


@contextlib.contextmanager
def _lease(lease: Any, gpus: Sequence[str], holder: str, mode: str, *, poll_s: float,
           renew_s: float) -> Iterator[None]:
    """Wait for ``mode``'s hold on all of ``gpus``, renew it in a thread while the body runs, give
    it back after (also when the wait itself is interrupted: a waiting measurement holds off
    start-ups)."""
    import ray

    gpus = sorted(set(gpus))
    try:
        while not ray.get(lease.try_acquire.remote(gpus, holder, mode)):
            time.sleep(poll_s)
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(renew_s):
                try:
                    if not ray.get(lease.renew.remote(gpus, holder, mode)):
                        logger.warning("%s lease of %s on %s lapsed before its renewal", mode, holder, gpus)
                except Exception:  # noqa: BLE001 - the sweep is ending; the lease expires by itself
                    return

        renewer = threading.Thread(target=renew, name=f"{mode}-lease-renew", daemon=True)
        renewer.start()
        try:
            yield
        finally:
            stop.set()
            renewer.join(timeout=renew_s)
    finally:
        try:
            ray.get(lease.release.remote(gpus, holder, mode))
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
    earlier = reported_metrics(context.run_dir, trial_id)
    if earlier is not None:
        # A resumed sweep restarts a trial whose result reached the run dir (and the Optuna study)
        # before the driver died but not Tune's experiment state: report it again, measure nothing.
        tune.report(earlier)
        return

    def report(metrics: dict[str, Any]) -> None:
        _save_reported(context.run_dir, trial_id, metrics)
        tune.report(metrics)
    try:
        config = context.space.config_from_trial_config(trial_config)
    except ConfigError as e:
        rows = failed_rows(sweep_id=context.sweep_id, trial_id=trial_id, role=role, config=None,
                           buckets=buckets, reason=f"invalid config: {e}")
        report(trial_metrics(rows, buckets, status=STATUS_FAILED, failure=str(e), role=role, config=None,
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
                report(trial_metrics(rows, buckets, status=status, failure=failure, role=role, config=config,
                                          cached=True, engine_started=False))
                return
            if verdict == "run":
                break
            time.sleep(0.5)

    rows: list[dict[str, Any]] | None = None
    try:
        gpus = [int(g) for g in ray.get_gpu_ids()] if config.backend is not Backend.SIM else None
        log_dir = Path(context.run_dir) / "engine-logs" / trial_id
        startup_guard = measure_guard = None
        if context.measure_lease_actor and gpus:
            lease = ray.get_actor(context.measure_lease_actor, namespace=context.cache_namespace)
            node = ray.get_runtime_context().get_node_id()
            gpu_keys = [f"{node}:{g}" for g in gpus]
            startup_guard = functools.partial(startup_lease, lease, gpu_keys, trial_id)
            measure_guard = functools.partial(measure_lease, lease, gpu_keys, trial_id)
        measurements, failure, startup_s = measure_config(
            config, buckets, log_dir=log_dir, gpus=gpus, sim_time_scale=context.sim_time_scale,
            steady_state=context.steady_state, steady_state_min_output_len=context.steady_state_min_output_len,
            ready_timeout_s=context.ready_timeout_s, request_timeout_s=context.request_timeout_s,
            tokenizer=_load_tokenizer(context.tokenizer),
            startup_guard=_within_time_budget(context.run_dir, startup_guard),
            measure_guard=measure_guard, repeats=context.repeats, burn_in=context.burn_in,
        )
        rows = rows_for_trial(sweep_id=context.sweep_id, trial_id=trial_id, role=role, config=config,
                              buckets=buckets, measurements=measurements, failure=failure,
                              engine_startup_s=startup_s)
        if gpus:
            facts = measured_on()
            rows = [{**r, **facts} for r in rows]
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
    report(trial_metrics(rows, buckets, status=status, failure=failure, role=role, config=config,
                              cached=False, engine_started=True))


def _within_time_budget(run_dir: str, guard: Callable[[], contextlib.AbstractContextManager[Any]] | None
                        ) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """``guard`` (if any), then the sweep's time-budget check, right before the engine starts.

    Tune suggests trials ahead of the resources they wait for (a 0.9-GPU baseline waited 9 minutes on
    the H200), and a shared GPU's start-up lease can hold a trial back too: whether the budget allows a
    start is decided when the engine is about to start. Past it, :class:`TimeBudgetSpent` ends the trial
    as errored, without a result, so a resumed sweep runs it."""

    @contextlib.contextmanager
    def entered() -> Iterator[None]:
        with guard() if guard is not None else contextlib.nullcontext():
            check_time_budget(run_dir)
            yield

    return entered


REPORTED_DIR = "trial-results"


def detect_gpus() -> tuple[str, int]:
    """(GPU type, count) of this node: nvidia-smi, else torch, else none."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=20, check=True).stdout.strip().splitlines()
            if out:
                return out[0].strip(), len(out)
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        import torch  # type: ignore[import-not-found]

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0), torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - torch absent or broken: no GPU info
        pass
    return "none", 0


def measured_on() -> dict[str, str | int | None]:
    """What a real engine was measured on, recorded in its rows by the trial (on the GPU node).

    The host's CPU model and the CPUs this process may use are there because a small model's engine
    is CPU-bound: H200 runs of the same configs measured 1.5x apart (GPU run 4), and which host CPU
    and how many cores the engine had is the first thing to compare."""
    from importlib import metadata

    try:
        lmdeploy = metadata.version("lmdeploy")
    except metadata.PackageNotFoundError:
        lmdeploy = None
    gpu_type, count = detect_gpus()
    return {"gpu_type": gpu_type if count else None, "lmdeploy_version": lmdeploy,
            "cpu_model": _cpu_model(), "cpus": len(os.sched_getaffinity(0))}


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        return None


def reported_trial_ids(run_dir: str | Path) -> list[str]:
    """The trials whose report reached the run dir (:func:`reported_metrics`), sorted."""
    return sorted(p.stem for p in (Path(run_dir) / REPORTED_DIR).glob("*.json"))


def reported_metrics(run_dir: str | Path, trial_id: str) -> dict[str, Any] | None:
    """What trial ``trial_id`` reported, if it got that far (``None`` otherwise)."""
    try:
        return json.loads((Path(run_dir) / REPORTED_DIR / f"{trial_id}.json").read_text())
    except (OSError, ValueError):
        return None


def _save_reported(run_dir: str | Path, trial_id: str, metrics: Mapping[str, Any]) -> None:
    """Keep a trial's report in the run dir (atomically) before handing it to Tune: the driver can
    die after the searcher recorded it but before Tune's experiment state did, and a resumed sweep
    must then re-report it, not measure it again (:func:`reported_metrics`)."""
    from orchestrator.fsutil import atomic_write_text

    d = Path(run_dir) / REPORTED_DIR
    d.mkdir(parents=True, exist_ok=True)
    atomic_write_text(d / f"{trial_id}.json", json.dumps(metrics, default=str))


def _load_tokenizer(path: str | None) -> Any:
    if not path:
        return None
    from tuning.workload import load_tokenizer

    return load_tokenizer(path)
