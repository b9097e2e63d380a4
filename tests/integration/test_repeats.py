"""Repeated runs of a bucket on one engine (``tuning.sweep --repeats``): which run stands for them,
what goes to results.csv, and a real simulated engine measured twice per bucket."""
from __future__ import annotations

import time

import pytest

from orchestrator.config import EngineConfig
from orchestrator.errors import ConfigError
from tuning.buckets import make_buckets
from tuning.results import figure_columns, rows_for_trial
from tuning.sweep.measure import MeasurePlan, measure_config, representative_run
from tuning.sweep.space import ROLE_SEARCH


def _run(tput: float, failed: int = 0) -> dict:
    return {"output_throughput": tput, "completed": 10 - failed, "failed": failed}


def test_the_lower_median_run_stands_for_the_repeats():
    assert representative_run([_run(5.0)]) == _run(5.0)  # one run: as it was, no extra field
    three = representative_run([_run(9.0), _run(7.0), _run(8.0)])
    assert three["output_throughput"] == 8.0 and three["repeat_output_throughputs"] == [9.0, 7.0, 8.0]
    assert representative_run([_run(9.0), _run(7.0)])["output_throughput"] == 7.0  # two: the slower


def test_a_run_with_failed_requests_is_never_hidden_by_the_good_ones():
    chosen = representative_run([_run(9.0), _run(8.0, failed=2), _run(7.0)])
    assert chosen["failed"] == 2 and chosen["repeat_output_throughputs"] == [9.0, 8.0, 7.0]


def test_results_carry_every_runs_throughput_and_their_spread():
    cols = figure_columns(representative_run([_run(900.0), _run(1000.0), _run(1100.0)]))
    assert cols["output_throughput"] == 1000.0
    assert cols["output_throughput_repeats"] == "900.0;1000.0;1100.0"
    assert cols["output_throughput_spread"] == pytest.approx(0.2)
    single = figure_columns(_run(500.0))
    assert single["output_throughput_repeats"] is None and single["output_throughput_spread"] is None


def test_a_simulated_engine_is_measured_twice_per_bucket(tmp_path):
    cfg = EngineConfig(backend="sim", model="intern-s2-preview-8xh200", tp=8, speculative_algorithm="qwen3_5_mtp",
                       num_draft_tokens=3, extra_flags=("--startup-delay", "0"))
    buckets = make_buckets([128, 512], input_len=128, concurrency_levels=(8,), num_prompts=16)
    plan = MeasurePlan(time_scale=50.0, steady_state=None, repeats=2)
    measurements, failure, startup_s = measure_config(cfg, buckets, plan, log_dir=tmp_path)
    assert failure == "" and startup_s is not None
    rows = rows_for_trial(sweep_id="s", trial_id="t", role=ROLE_SEARCH, config=cfg, buckets=buckets,
                          measurements=measurements, failure=failure, engine_startup_s=startup_s)
    assert [r["bucket"] for r in rows] == ["le128", "le512"]
    for r in rows:
        runs = [float(x) for x in r["output_throughput_repeats"].split(";")]
        assert len(runs) == 2 and all(x > 0 for x in runs)
        assert r["output_throughput"] == pytest.approx(min(runs), abs=0.1)
        assert r["output_throughput_spread"] is not None and r["output_throughput_spread"] >= 0
        assert 0 <= r["host_cpu_busy_max"] <= 1  # this host's CPU load while it ran, read each round
        # How far behind its schedule the engine ran, read each round: a share of the run's simulated duration,
        # past 1 where the host stalled the engine longer than the run lasted (1.21 beside a busy loop here).
        assert r["sim_lag_share_max"] >= 0


def test_repeats_flag_reaches_the_trials_and_old_runs_still_load(tmp_path):
    import json

    from orchestrator.errors import ConfigError
    from tuning.sweep import SweepSpec, _parser, build_spec

    argv = ["--run-dir", str(tmp_path / "r"), "--sim-profile", "intern-s2-preview-8xh200"]
    spec = build_spec(_parser().parse_args([*argv, "--repeats", "3"]), cluster_gpus=0)
    assert spec.repeats == 3 and spec.trial_context(None, None).plan.repeats == 3
    # The measurement settings travel whole, as one plan, from the spec to the trial.
    assert spec.trial_context(None, None).plan == spec.measure_plan() == MeasurePlan(
        time_scale=spec.sim_time_scale, steady_state=spec.steady_state,
        steady_state_min_output_len=spec.steady_state_min_output_len, ready_timeout_s=spec.ready_timeout_s,
        request_timeout_s=spec.request_timeout_s, tokenizer=None, repeats=3, burn_in=False)
    assert SweepSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    old = {k: v for k, v in spec.to_dict().items() if k != "repeats"}  # a sweep.json from before the flag
    assert SweepSpec.from_dict(old).repeats == 1
    assert build_spec(_parser().parse_args(argv), cluster_gpus=0).repeats == 1  # default
    with pytest.raises(ConfigError, match="repeats"):
        build_spec(_parser().parse_args([*argv, "--repeats", "0"]), cluster_gpus=0)


# ----- a trial restarted after its result was recorded ------------------------------------------------
def test_a_reported_trial_is_kept_in_the_run_dir(tmp_path):
    from tuning.sweep.records import ResultRow, TrialReport

    assert TrialReport.load(tmp_path, "t1") is None
    rows = [ResultRow(sweep_id="s", trial_id="t1", role=ROLE_SEARCH, status="ok", bucket="le256", primary_load=True,
                      output_throughput=4961.4, workload=None)]
    report = TrialReport.build(rows, make_buckets([256], input_len=128, concurrency_levels=(8,), num_prompts=8),
                               status="ok", failure="", role=ROLE_SEARCH, engine_key="k", engine_label="l",
                               cached=False, engine_started=True)
    metrics = report.metrics()
    assert metrics["tput_le256"] == 4961.4 and "rows" not in metrics  # Tune gets figures, not rows
    report.save(tmp_path, "t1")
    assert TrialReport.load(tmp_path, "t1") == report
    (tmp_path / "trial-results" / "t2.json").write_text("{truncated")
    assert TrialReport.load(tmp_path, "t2") is None  # not a report: the trial runs


def test_a_run_dir_from_before_typed_rows_still_loads(tmp_path):
    """Committed run dirs (benchmarks/results/*/trial-results) keep their rows as one JSON string."""
    import json

    from tuning.sweep.records import TrialReport

    row = {"sweep_id": "s", "trial_id": "t1", "role": "search", "status": "ok", "bucket": "le256",
           "primary_load": True, "output_throughput": 10.0, "gpu_type": "NVIDIA H200"}
    old = {"status": "ok", "failure_reason": "", "role": "search", "cached": False, "engine_key": "k",
           "engine_label": "l", "engine_starts": 1, "rows_json": json.dumps([row]), "tput_le256": 10.0, "score": 2.3}
    (tmp_path / "trial-results").mkdir()
    (tmp_path / "trial-results" / "t1.json").write_text(json.dumps(old))
    loaded = TrialReport.load(tmp_path, "t1")
    assert loaded.rows[0].gpu_type == "NVIDIA H200" and loaded.bucket_throughput == {"le256": 10.0}
    assert loaded.metrics()["score"] == 2.3
    # ... and every report committed under benchmarks/results reads back, rows and all.
    from pathlib import Path

    from tuning.sweep.records import reported_trial_ids

    run_dirs = [d.parent for d in (Path(__file__).parents[2] / "benchmarks" / "results").glob("*/*/trial-results")]
    assert run_dirs
    for run_dir in run_dirs:
        for trial_id in reported_trial_ids(run_dir):
            report = TrialReport.load(run_dir, trial_id)
            assert report is not None and report.rows and {r.trial_id for r in report.rows} == {trial_id}, trial_id


def test_the_searcher_is_not_told_twice_about_a_trial_the_study_has_finished(tmp_path):
    """Optuna commits at once, Tune's experiment state every few seconds: a resumed sweep can restart
    a trial whose Optuna trial is finished. Re-reporting it must not crash the sweep."""
    import optuna

    from tuning.sweep.budget import write_budget
    from tuning.sweep.searcher import BudgetedSearch
    from tuning.sweep.space import SearchSpace

    space = SearchSpace(engine="sim", model="intern-s2-preview-8xh200", tp=8, memory_fraction=(0.8,),
                        max_batch_size=(64,))
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), study_name="s", direction="maximize",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    write_budget(tmp_path, num_trials=4, time_budget_s=None)
    searcher = BudgetedSearch(study, space, tmp_path / "budget.json", metric="score", mode="max")
    config = searcher.suggest("t1")
    assert config is not None and "speculative" in config
    study.tell(searcher.trial_numbers["t1"], 1.0)  # recorded before the driver died
    result = {"score": 1.0, "engine_key": "k", "training_iteration": 1}  # as Tune passes it
    searcher.on_trial_result("t1", result)
    searcher.on_trial_complete("t1", result)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE]
    assert searcher.known == {"k": {"score": 1.0}}


def _served(engine) -> float:
    """Requests the simulated ``engine`` has served, by its own counter."""
    import httpx

    from orchestrator.serve.metrics import parse_prometheus_text

    return parse_prometheus_text(httpx.get(engine.base_url + "/metrics", timeout=10).text)["sim_requests_total"]


def test_the_burn_in_runs_the_first_bucket_once_more_unmeasured(tmp_path):
    """On real engines (``burn_in``) the first bucket's workload runs before anything is measured —
    once, or as a whole again until ``burn_in_s`` have passed: the engine serves it (its own request
    counter says so), the measurements do not include it. Without it, the same engine serves exactly
    the measured requests."""

    from orchestrator.engine import EngineProcess
    from tuning.sweep.measure import measure_buckets

    cfg = EngineConfig(backend="sim", model="intern-s2-preview-8xh200", tp=8, extra_flags=("--startup-delay", "0"))
    buckets = make_buckets([128, 512], input_len=128, concurrency_levels=(8,), num_prompts=12)
    engine = EngineProcess(cfg, log_dir=tmp_path, sim_time_scale=50.0)
    engine.start()
    try:
        engine.wait_until_ready()

        deltas, took = {}, {}
        for burn_in, seconds in ((False, 0.0), (True, 0.0), (True, 3.0)):
            before, measurements, t0 = _served(engine), {}, time.monotonic()
            plan = MeasurePlan(steady_state=None, request_timeout_s=60, burn_in=burn_in, burn_in_s=seconds,
                               sim_remeasure=0)  # every run once: the counts below are the burn-in's
            failure = measure_buckets(engine, cfg, buckets, plan, measurements=measurements)
            assert failure == "" and sorted(measurements) == [("le128", 8), ("le512", 8)]
            assert all(m["completed"] == 12 for m in measurements.values())
            deltas[burn_in, seconds], took[burn_in, seconds] = _served(engine) - before, time.monotonic() - t0
    finally:
        engine.stop()
    first = buckets[0].workload_at(8)
    once = first.num_prompts + first.warmup_requests
    assert deltas[False, 0.0] == sum(b.workload_at(8).num_prompts + b.workload_at(8).warmup_requests for b in buckets)
    assert deltas[True, 0.0] - deltas[False, 0.0] == once
    # With seconds to fill, the burn-in ran again as a whole until they had passed.
    repeated = deltas[True, 3.0] - deltas[False, 0.0]
    assert repeated % once == 0 and repeated >= 2 * once and took[True, 3.0] >= 3.0


def test_burn_in_is_on_for_real_engines_and_can_be_turned_off(tmp_path, model_dir):
    from tuning.sweep import _parser, build_spec

    model = model_dir
    run_dir = str(tmp_path / "r")

    def spec(*argv):
        return build_spec(_parser().parse_args([*argv, "--run-dir", run_dir]), cluster_gpus=8)

    assert spec("--model", str(model)).trial_context(None, None).plan.burn_in is True
    from tuning.sweep import GPU_BURN_IN_S

    assert spec("--model", str(model)).trial_context(None, None).plan.burn_in_s == GPU_BURN_IN_S > 0
    assert spec("--model", str(model), "--burn-in-s", "5").measure_plan().burn_in_s == 5.0
    assert spec("--model", str(model), "--no-burn-in").burn_in_s == 0.0 == spec().burn_in_s
    for bad in ("-1", "inf", "nan"):
        with pytest.raises(ConfigError, match="burn_in_s"):
            spec("--model", str(model), "--burn-in-s", bad)
    # ... and real engines measure in rounds, so their figures carry intervals; the simulator once.
    from tuning.sweep import GPU_ROUNDS

    assert GPU_ROUNDS >= 2 and spec("--model", str(model)).repeats == GPU_ROUNDS
    assert spec("--model", str(model), "--repeats", "1").repeats == 1 and spec().repeats == 1
    assert spec("--model", str(model), "--no-burn-in").trial_context(None, None).plan.burn_in is False
    assert spec().trial_context(None, None).plan.burn_in is False  # the simulator has nothing to burn in


def test_repeats_run_in_rounds_each_under_its_own_guard(tmp_path):
    """``--repeats 2``: every point once per round, the burn-in only in the first, the guard entered
    once per round and left between them (so engines sharing a GPU can take turns), the engine's
    stop inside the last round's guard; every point carries both rounds' throughputs."""
    import contextlib

    from orchestrator.engine import EngineProcess
    from tuning.sweep.measure import measure_buckets

    cfg = EngineConfig(backend="sim", model="intern-s2-preview-8xh200", tp=8, extra_flags=("--startup-delay", "0"))
    buckets = make_buckets([128, 512], input_len=128, concurrency_levels=(8,), num_prompts=12)
    engine = EngineProcess(cfg, log_dir=tmp_path, sim_time_scale=50.0)
    events: list[tuple[str, float]] = []

    @contextlib.contextmanager
    def guard():
        events.append(("enter", _served(engine)))
        try:
            yield
        finally:
            events.append(("exit", _served(engine) if engine.is_alive() else -1.0))

    engine.start()
    try:
        engine.wait_until_ready()
        measurements: dict = {}
        plan = MeasurePlan(steady_state=None, request_timeout_s=60, burn_in=True, repeats=2,
                           sim_remeasure=0)  # every run once: the counts below are the rounds'
        failure = measure_buckets(engine, cfg, buckets, plan, measurements=measurements, round_guard=guard,
                                  on_last_round=lambda: events.append(("stop", float(engine.is_alive()))))
    finally:
        engine.stop()
    assert failure == ""
    per_round = sum(b.workload_at(8).num_prompts + b.workload_at(8).warmup_requests for b in buckets)
    first = buckets[0].workload_at(8)
    (e0, n0), (x0, m0), (e1, n1), (s1, alive), (x1, _) = events
    assert (e0, x0, e1, s1, x1) == ("enter", "exit", "enter", "stop", "exit") and alive == 1.0
    assert m0 - n0 == per_round + first.num_prompts + first.warmup_requests  # round 1: burn-in + every point
    assert n1 == m0  # nothing served between the rounds
    assert sorted(measurements) == [("le128", 8), ("le512", 8)]
    assert all(len(m["repeat_output_throughputs"]) == 2 for m in measurements.values())


@pytest.mark.parametrize("rounds_before_stop", [2, 0])
def test_the_hard_limit_stops_the_rounds_and_keeps_those_measured(tmp_path, rounds_before_stop):
    """``should_stop`` (the sweep's ``--stop-after-s``) is asked once the round's guard is held: on a
    shared GPU the wait for it can outlast the limit, as here, where the limit passes while the engine
    waits for its next round. That round does not run, the engine stops under the same hold, and the
    points measured in every round that ran count. Stopped before the first round, nothing was measured:
    the trial ends like a start the time budget refused (``StoppedAtLimit``), so a resume runs it."""
    import contextlib

    from orchestrator.engine import EngineProcess
    from tuning.sweep.budget import StoppedAtLimit, TimeBudgetSpent
    from tuning.sweep.measure import measure_buckets

    cfg = EngineConfig(backend="sim", model="intern-s2-preview-8xh200", tp=8, extra_flags=("--startup-delay", "0"))
    buckets = make_buckets([128], input_len=128, concurrency_levels=(8,), num_prompts=8)
    engine = EngineProcess(cfg, log_dir=tmp_path, sim_time_scale=50.0)
    events: list[str] = []
    limit_passed = [False]

    @contextlib.contextmanager
    def guard():
        if events.count("enter") == rounds_before_stop:
            limit_passed[0] = True  # the limit passes while this engine waits for the GPU
        events.append("enter")
        try:
            yield
        finally:
            events.append("exit")

    engine.start()
    try:
        engine.wait_until_ready()
        measurements: dict = {}
        plan = MeasurePlan(steady_state=None, request_timeout_s=60, repeats=5, sim_remeasure=0)
        with contextlib.nullcontext() if rounds_before_stop else pytest.raises(StoppedAtLimit, match="--resume"):
            failure = measure_buckets(engine, cfg, buckets, plan, measurements=measurements, round_guard=guard,
                                      on_last_round=lambda: events.append(f"stop alive={engine.is_alive()}"),
                                      should_stop=lambda: limit_passed[0])
    finally:
        engine.stop()
    assert events == ["enter", "exit"] * rounds_before_stop + ["enter", "stop alive=True", "exit"]
    assert issubclass(StoppedAtLimit, TimeBudgetSpent)  # the trial lets it through: errored, no result
    if rounds_before_stop:
        assert failure == ""
        assert [len(m["repeat_output_throughputs"]) for m in measurements.values()] == [rounds_before_stop]
    else:
        assert measurements == {}


def test_a_simulated_run_whose_engine_fell_behind_is_measured_again(tmp_path):
    """A simulated engine stopped for a moment mid-run (SIGSTOP, as a starved host would) runs behind its
    schedule; that run is measured again, and the run that stands says how far behind it was. The
    engine's own request counter shows the extra run. The stop comes once the measured run has served a
    wave by that counter, not at a fixed time: on a busy host the warm-up can outlast any fixed delay.

    A stop does not always put the engine behind: one that lands while its clock is held for the
    closed-loop client's next requests (``SimEngine._hold``: the clock stands still while it waits) or
    while it has nothing to run leaves its schedule as it was, rightly so, and the run is not measured
    again. On a busy host the client is slow to follow up and holds are frequent (a fixed single stop
    missed in 8 of 20 runs beside two busy loops), so the stop is repeated, while the first run lasts,
    until the engine's own lateness counter shows it fell behind (the first steps after a stop that
    counts are ~``stop_s * time_scale`` simulated seconds late)."""
    import os
    import signal
    import threading

    import httpx

    from orchestrator.engine import EngineProcess
    from tuning.drive.summary import MAX_LAG_SHARE
    from tuning.sweep.measure import measure_buckets

    time_scale, stop_s = 10.0, 1.0
    cfg = EngineConfig(backend="sim", model="intern-s2-preview-8xh200", tp=8, extra_flags=("--startup-delay", "0"))
    buckets = make_buckets([1024], input_len=128, concurrency_levels=(8,), num_prompts=64)  # 16 s simulated
    engine = EngineProcess(cfg, log_dir=tmp_path, sim_time_scale=time_scale)
    engine.start()
    stops: list[str] = []  # what became of each stop: "behind" (it counted) or "absorbed"
    try:
        engine.wait_until_ready()

        before, measurements = _served(engine), {}
        first = buckets[0].workload_at(8)
        once = first.num_prompts + first.warmup_requests

        def stall() -> None:
            with httpx.Client(base_url=engine.base_url, timeout=30) as client:
                def info() -> dict:
                    return client.get("/sim/info").json()

                deadline = time.monotonic() + 120
                while info()["counters"]["requests"] < before + first.warmup_requests + 8:
                    if time.monotonic() > deadline:
                        return
                    time.sleep(0.02)
                while time.monotonic() < deadline:
                    i = info()
                    if i["counters"]["requests"] - before > once - 8:
                        return  # under two waves left, too little to run behind in: the assertions say so
                    late = i["lateness_s"]
                    os.kill(engine.pid, signal.SIGSTOP)
                    time.sleep(stop_s)
                    os.kill(engine.pid, signal.SIGCONT)
                    steps = None
                    while time.monotonic() < deadline:  # did it count? the engine's next steps say
                        i = info()
                        if i["lateness_s"] - late >= stop_s * time_scale / 2:
                            stops.append("behind")
                            return
                        steps = i["counters"]["steps"] if steps is None else steps
                        if i["counters"]["steps"] >= steps + 5:  # steps since the stop, none of them late
                            stops.append("absorbed")  # held or idle through it: stop again
                            break
                        time.sleep(0.02)

        staller = threading.Thread(target=stall, daemon=True)
        staller.start()
        plan = MeasurePlan(steady_state=None, request_timeout_s=60, sim_remeasure=3)
        failure = measure_buckets(engine, cfg, buckets, plan, measurements=measurements)
        staller.join()
        delta = _served(engine) - before
    finally:
        os.kill(engine.pid, signal.SIGCONT)
        engine.stop()
    assert failure == ""
    assert stops and stops[-1] == "behind", f"no stop put the engine behind during the first run: {stops}"
    run = measurements[("le1024", 8)]
    assert run["sim_remeasured"] >= 1 and delta == once * (1 + run["sim_remeasured"]), (stops, run["sim_remeasured"],
                                                                                         delta)
    assert run["sim_lag_share"] <= MAX_LAG_SHARE or run["sim_remeasured"] == plan.sim_remeasure
