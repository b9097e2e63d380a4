"""Measure one engine config on every bucket, without Ray: start the engine, warm up, run the buckets,
stop it. A plain script can call :func:`measure_config`; the sweep's Tune trial is one such caller.

How a config is measured is one frozen :class:`MeasurePlan`, built once from the sweep's spec
(:meth:`tuning.sweep.spec.SweepSpec.measure_plan`) and carried whole to the measurement.

Engine start-up dominates (60-170 s for LMDeploy on an H200), so one start serves all buckets. A
failure of the engine (crash, OOM, hang) is a *result* — the reason is returned, never raised — so a
sweep learns the config is bad and goes on.
"""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config import EngineConfig
from orchestrator.errors import ConfigError, EngineError, OrchestratorError
from orchestrator.hostinfo import busy_share, cpu_times
from tuning.buckets import Bucket
from tuning.drive.summary import MAX_LAG_SHARE
from tuning.sweep.budget import StoppedAtLimit, TimeBudgetSpent

__all__ = ["MeasurePlan", "Measurements", "burn_in_until", "failure_reason", "measure_buckets", "measure_config",
           "measure_steps", "representative_run", "sim_lag_share", "sim_loop_counters"]

logger = logging.getLogger(__name__)

Guard = Callable[[], contextlib.AbstractContextManager[Any]]
Measurements = dict[tuple[Any, ...], dict[str, Any]]
"""``BenchResult.to_dict()`` by :meth:`Bucket.measurement_key`: (bucket name, concurrency) at the bucket's
primary temperature, (bucket name, concurrency, temperature) at its others."""


@dataclass(frozen=True)
class MeasurePlan:
    """How every config of a sweep is measured (the same for each; what is measured are the buckets).

    Each bucket's warm-up requests are part of its workload (``Bucket.workload.warmup_requests``), so
    they travel with the bucket and are recorded with it in the table's provenance.

    Args:
        time_scale: simulator ``--time-scale`` (simulated engines only; figures stay in simulated time).
        steady_state: ``tuning.bench.SteadyStateRule`` arguments, or ``None`` to run every request to
            completion.
        steady_state_min_output_len: the rule applies to buckets at least this long (short buckets
            finish fast, and their ramp-up/down is part of what a client sees).
        ready_timeout_s: how long an engine may take to answer ``/v1/models``.
        request_timeout_s: per-request timeout of the bench client.
        tokenizer: tokenizer path for LMDeploy workloads (``None``: the bench's default counter).
        repeats: runs of each bucket x load level on the same engine; the lower-median run stands
            for them (:func:`representative_run`). On real GPUs short runs vary, and repeats on one
            engine tell run-to-run noise apart from engine-to-engine differences.
        burn_in: run the first bucket's workload once per temperature measured, unmeasured, before
            measuring: a fresh engine's first full-load run is slower (one-time kernel and graph set-up
            that short warm-up requests do not trigger), which would bias whichever bucket came first,
            and the first sampled run pays it again for the sampling kernels (a greedy-only warm-up
            left the first sampled wave's TTFT at 3-4x the next engine start's on the H200).
        sim_remeasure: a simulated run whose engine fell further behind its schedule than
            :data:`tuning.drive.summary.MAX_LAG_SHARE` of the run, or whose closed-loop client left its
            slots empty that long (host too busy for the time scale, :func:`sim_lag_share`), is run
            again, up to this many times; the last run stands, its lag recorded either way (a simulated
            figure counts only when its engine kept up).
        burn_in_s: with ``burn_in``, its runs are repeated until they have lasted at least this long:
            a fresh engine can keep speeding up for tens of seconds of load, past its first full
            wave, and a round 0 still on that slope would be the slow one of every config.
    """

    time_scale: float | None = None
    steady_state: Mapping[str, Any] | None = field(default_factory=lambda: {"rel_tolerance": 0.02})
    steady_state_min_output_len: int = 4096
    ready_timeout_s: float = 900.0
    request_timeout_s: float = 3600.0
    tokenizer: str | None = None
    repeats: int = 1
    burn_in: bool = False
    burn_in_s: float = 0.0
    sim_remeasure: int = 2

    def __post_init__(self) -> None:
        if not isinstance(self.repeats, int) or self.repeats < 1:
            raise ConfigError(f"repeats={self.repeats!r} must be a whole number >= 1")
        if not isinstance(self.sim_remeasure, int) or self.sim_remeasure < 0:
            raise ConfigError(f"sim_remeasure={self.sim_remeasure!r} must be a whole number >= 0")
        if not 0 <= self.burn_in_s < float("inf"):
            raise ConfigError(f"burn_in_s={self.burn_in_s!r} must be a finite number of seconds >= 0")
        if self.time_scale is not None and self.time_scale <= 0:
            raise ConfigError(f"time_scale={self.time_scale!r} must be > 0")

    def steady_state_rule(self, bucket: Bucket) -> Any:
        """The early-stop rule for ``bucket`` (``None``: run every request to completion)."""
        if not self.steady_state or bucket.max_output_len < self.steady_state_min_output_len:
            return None
        from tuning.bench import SteadyStateRule

        return SteadyStateRule(**self.steady_state)

    def load_tokenizer(self) -> Any:
        if not self.tokenizer:
            return None
        from tuning.workload import load_tokenizer

        return load_tokenizer(self.tokenizer)


def measure_config(
    config: EngineConfig,
    buckets: Sequence[Bucket],
    plan: MeasurePlan = MeasurePlan(),
    *,
    log_dir: str | Path,
    gpus: Sequence[int] | None = None,
    startup_guard: Guard | None = None,
    measure_guard: Guard | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[Measurements, str, float | None]:
    """Start one engine, run every bucket x load level against it as ``plan`` says, stop it.

    ``startup_guard`` is entered before the engine starts and left once it is ready or failed;
    ``measure_guard`` is entered after that and held while it is measured, once per round of
    ``plan.repeats`` (engines sharing a GPU: start side by side, measure one at a time, never while a
    neighbour starts; with a fair guard their rounds interleave). The two are never held together, so
    a caller waiting for one never holds the other. ``startup_s`` counts from the
    engine's start, not from the wait for ``startup_guard``. ``should_stop``: the sweep's hard limit, asked
    at the start of each round (:func:`measure_buckets`).

    Returns ``(measurements, failure, startup_s)``: ``BenchResult`` dicts by (bucket, concurrency),
    the reason the engine failed ('' if it did not), and the engine's start-up time in seconds
    (simulated seconds for the simulator, like its other figures). :class:`TimeBudgetSpent` raised
    by ``startup_guard`` passes through: that start was not allowed, which is not a config's failure.
    """
    from orchestrator.engine import EngineProcess

    tokenizer = plan.load_tokenizer()  # before the engine starts: a bad path costs no engine start
    is_sim = config.simulated
    engine = EngineProcess(config, gpus=None if is_sim else gpus, log_dir=log_dir,
                           ready_timeout_s=plan.ready_timeout_s, sim_time_scale=plan.time_scale if is_sim else None)
    measurements: Measurements = {}
    startup_s: float | None = None
    try:
        try:
            with startup_guard() if startup_guard is not None else contextlib.nullcontext():
                t0 = time.monotonic()
                engine.start()
                engine.wait_until_ready()
                startup_s = time.monotonic() - t0
        except TimeBudgetSpent:
            raise
        except OrchestratorError as e:
            return measurements, failure_reason("engine failed to start", e), None
        if is_sim and plan.time_scale:
            startup_s *= plan.time_scale
        # Stopped inside the last round's exclusive hold: a neighbour's measurement never overlaps
        # this engine's teardown, and a neighbour's start-up (which sizes its KV cache from the GPU
        # memory free at that moment) sees this engine's memory already released.
        failure = measure_buckets(engine, config, buckets, plan, measurements=measurements, tokenizer=tokenizer,
                                  round_guard=measure_guard, on_last_round=engine.stop, should_stop=should_stop)
        return measurements, failure, startup_s
    finally:
        engine.stop()


def measure_steps(buckets: Sequence[Bucket], *, burn_in: bool) -> list[tuple[Bucket, int, float, bool]]:
    """``(bucket, concurrency, temperature, measured)`` in the order an engine runs them: with
    ``burn_in``, the first bucket at its primary load once per temperature measured (in first-measured
    order), unmeasured; then every bucket's points. The burn-in is part of the same loop as the buckets,
    so a failure in either is reported the same way."""
    steps: list[tuple[Bucket, int, float, bool]] = []
    if burn_in and buckets:
        temperatures = dict.fromkeys(t for b in buckets for _, t in b.points())
        steps += [(buckets[0], buckets[0].primary_concurrency, t, False) for t in temperatures]
    return steps + [(b, c, t, True) for b in buckets for c, t in b.points()]


def sim_loop_counters(base_url: str) -> dict[str, dict[str, float]] | None:
    """A simulated engine's loop counters so far (``GET /sim/info``, :func:`tuning.drive.backend.sim_counters_of`):
    its steps and the simulated seconds it ran behind its deadlines, summed over them; ``None`` when they
    cannot be read."""
    import httpx

    from orchestrator.engine import HEALTH_CHECK_TIMEOUT_S
    from tuning.drive.backend import sim_counters_of

    try:  # a health check's wait: an engine that does not answer is hung, and the check after the run says so
        return sim_counters_of(httpx.get(base_url + "/sim/info", timeout=HEALTH_CHECK_TIMEOUT_S).json()) or None
    except (httpx.HTTPError, ValueError):
        return None


def sim_lag_share(before: Mapping[str, Mapping[str, float]] | None, after: Mapping[str, Mapping[str, float]] | None,
                  duration_s: float | None, concurrency: int | None = None) -> float | None:
    """The share by which a simulated measurement's figure can be off because the host was too busy
    (:data:`tuning.drive.summary.MAX_LAG_SHARE` bounds it); ``None`` without both counters, steps or a
    duration. The larger of two shares, over the measurement's simulated duration:

    - the engine's: its mean lag per step (:class:`tuning.drive.records.EngineLateness` between two
      :func:`sim_loop_counters`); a lag of L shifts when tokens arrive by about L;
    - the closed-loop client's (with ``concurrency``): the simulated seconds its slots stayed empty while
      its next requests were late (``client_lateness_s``), over the ``concurrency`` slots' time. A starved
      client lowers the figure as much as a late engine, while the engine keeps its schedule."""
    from tuning.drive.backend import lateness_between

    if before is None or after is None or not duration_s or duration_s <= 0:
        return None
    ran = [e for e in lateness_between(before, after) if e.steps > 0]
    if not ran:
        return None
    share = max(max(0.0, e.mean_lag_s) for e in ran) / duration_s
    if concurrency:
        late = max(a.get("client_lateness_s", 0.0) - before.get(name, {}).get("client_lateness_s", 0.0)
                   for name, a in after.items())
        share = max(share, late / (duration_s * concurrency))
    return round(share, 6)


def burn_in_until(steps: Sequence[tuple[Bucket, int, float, bool]], seconds: float, *,
                  clock: Callable[[], float] = time.monotonic) -> Iterator[tuple[Bucket, int, float, bool]]:
    """``steps`` (as :func:`measure_steps` orders them) with the unmeasured ones — the burn-in — run
    again, as a whole, until ``seconds`` have passed since the first began (``clock``); then the measured
    ones. Lazy: the clock is read as the runs go."""
    burn = [s for s in steps if not s[3]]
    start = clock()
    yield from burn
    while burn and clock() - start < seconds:
        yield from burn
    yield from (s for s in steps if s[3])


def measure_buckets(engine: Any, config: EngineConfig, buckets: Sequence[Bucket], plan: MeasurePlan, *,
                    measurements: Measurements, tokenizer: Any = None, round_guard: Guard | None = None,
                    on_last_round: Callable[[], None] | None = None,
                    should_stop: Callable[[], bool] | None = None) -> str:
    """Every bucket x load level against the ready ``engine`` into ``measurements``, in ``plan.repeats``
    rounds (each round runs every point once; the burn-in, if ``plan.burn_in``, leads the first, for at
    least ``plan.burn_in_s``);
    returns the failure reason ('' when all ran). ``tokenizer``: the loaded ``plan.tokenizer`` (loaded
    once per engine by the caller).

    Why rounds rather than each point's repeats back to back: a drift of the engine then touches every
    point alike, and ``round_guard`` — entered for each round and left between them — lets engines
    that share a GPU take turns (with the sweep's fair lease their rounds interleave, so configs are
    compared round by round, not one engine's good minute against another's bad one).
    ``on_last_round`` runs inside the last round's guard, after its measurements or a failure (the
    caller stops the engine there).

    ``should_stop`` (the sweep's hard limit, ``--stop-after-s``) is asked at the start of each round, once
    the guard is held (on a shared GPU the wait for it can outlast the limit): once it says stop, the round
    does not run and ``on_last_round`` runs under that hold instead. The points measured in every round
    that ran count, so a sweep at its limit still commits what it measured, on fewer rounds (each row's
    throughputs say how many). Stopped before the first round, nothing was measured:
    :class:`~tuning.sweep.budget.StoppedAtLimit` is raised (like a start the time budget refused, the trial
    then ends without a result, and a resumed sweep runs it)."""
    from tuning.bench import benchmark

    steps = measure_steps(buckets, burn_in=plan.burn_in)
    simulated = config.simulated
    runs: dict[tuple[Any, ...], list[dict[str, Any]]] = {}

    def run_round(rnd: int) -> str:
        """One round of every point (led by the burn-in in the first); the failure, '' if none."""
        for b, c, t, measured in (burn_in_until(steps, plan.burn_in_s) if rnd == 0 else steps):
            if not measured and rnd > 0:
                continue
            what = f"bucket {b.name}" if measured else f"the burn-in run of bucket {b.name}"
            if t != b.primary_temperature:
                what += f" at temperature {t:g}"
            rule = plan.steady_state_rule(b) if measured else None
            try:
                for again in range(1 + (plan.sim_remeasure if simulated and measured else 0)):
                    host_before = cpu_times()
                    sim_before = sim_loop_counters(engine.base_url) if simulated and measured else None
                    run = benchmark(engine.base_url, b.workload_at(c, t), engine_config=config,
                                    steady_state=rule, request_timeout_s=plan.request_timeout_s,
                                    tokenizer=tokenizer).to_dict()
                    run["host_cpu_busy"] = busy_share(host_before, cpu_times())
                    if sim_before is not None:
                        run["sim_lag_share"] = sim_lag_share(sim_before, sim_loop_counters(engine.base_url),
                                                             run.get("duration_s"), c)
                        run["sim_remeasured"] = again
                    if not (run.get("sim_lag_share") or 0.0) > MAX_LAG_SHARE:
                        break
                engine.check_health()
            except EngineError as e:
                return failure_reason(f"engine failed during {what} (concurrency {c})", e)
            except OrchestratorError as e:  # bench could not run at all (server unreachable...)
                return failure_reason(f"engine died during {what}" if not engine.is_alive()
                                      else f"benchmark of {what} failed", e)
            if measured:
                runs.setdefault(b.measurement_key(c, t), []).append(run)
        return ""

    failure = ""
    rounds = plan.repeats
    for rnd in range(plan.repeats):
        last = rnd == plan.repeats - 1
        with round_guard() if round_guard is not None else contextlib.nullcontext():
            # Asked once the GPU is this engine's: on a shared GPU the wait for it can outlast the limit.
            if should_stop is not None and should_stop():
                rounds = rnd
                logger.warning("the sweep's hard limit: %s stops after %d of %d rounds", config.label(), rnd,
                               plan.repeats)
                if on_last_round is not None:
                    on_last_round()
                if rnd == 0:
                    raise StoppedAtLimit(f"{config.label()} was not measured: the sweep's hard limit "
                                         "(--stop-after-s) came before its first round; --resume RUN_DIR runs it")
                break
            failure = run_round(rnd)
            if (last or failure) and on_last_round is not None:
                on_last_round()
        if failure:
            break
    # A point measured in every round counts (every round that ran, where the hard limit cut the rounds);
    # one cut short by a failure does not (as before rounds).
    for key, point_runs in runs.items():
        if len(point_runs) == rounds:
            measurements[key] = representative_run(point_runs)
    return failure


def representative_run(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The run that stands for repeated runs of one bucket: one with failed requests if any (a config
    must not win on its good runs), else the lower median by output throughput (with two runs, the
    slower: a table should not pick a config on its luckier run). Carries every run's throughput in
    run order as ``repeat_output_throughputs``, and every run's host CPU busy share and simulated lag as
    ``repeat_host_cpu_busy`` / ``repeat_sim_lag_share`` (either distorts any of the runs, not only the
    one that stands)."""
    if len(runs) == 1:
        return dict(runs[0])
    failed = [r for r in runs if int(r.get("failed") or 0) > 0]
    ranked = sorted(runs, key=lambda r: float(r.get("output_throughput") or 0.0))
    chosen = failed[0] if failed else ranked[(len(ranked) - 1) // 2]
    return {**chosen, "repeat_output_throughputs": [r.get("output_throughput") for r in runs],
            "repeat_host_cpu_busy": [r.get("host_cpu_busy") for r in runs],
            "repeat_sim_lag_share": [r.get("sim_lag_share") for r in runs]}


def failure_reason(prefix: str, e: BaseException, limit: int = 1500) -> str:
    """The failure as one bounded string. When too long, the middle goes: the head says what failed,
    the tail holds the engine's last log lines (the OOM or traceback that says why)."""
    text = f"{prefix}: {type(e).__name__}: {e}"
    if len(text) <= limit:
        return text
    head = limit // 2
    return text[:head] + " [...] " + text[len(text) - (limit - head - 7):]
