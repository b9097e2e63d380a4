"""The simulated engine's run-to-run variation (``--noise-start-sd``, ``--noise-sd``): off by default,
one factor per engine start and one per time window on every iteration's time, log-normal with median 1."""
from __future__ import annotations

import math
import statistics

import pytest

from orchestrator.sim.model import EngineParams, PerformanceModel, load_profile
from orchestrator.sim.noise import EngineNoise
from orchestrator.sim.scheduler import Scheduler, make_request

PROFILE = "qwen35-moe-testbed-1xh200"


def _model() -> PerformanceModel:
    profile = load_profile(PROFILE)
    return PerformanceModel(profile, EngineParams(tp=profile.num_gpus, num_draft_tokens=0, memory_fraction=0.5,
                                                  max_batch_size=64, session_len=2048))


def test_without_noise_every_factor_is_one():
    off = EngineNoise()
    assert not off.active
    f = off.slowdown()
    assert {f(t) for t in (0.0, 3.0, 1e4)} == {1.0}


def test_the_start_factor_holds_for_a_start_and_differs_between_starts():
    starts = [EngineNoise(start_sd=0.05).slowdown() for _ in range(200)]
    for f in starts[:5]:
        assert f(0.0) == f(7.0) == f(1e5)  # one factor for all of a start's iterations
    logs = [math.log(f(0.0)) for f in starts]
    assert len(set(logs)) == len(logs)  # unseeded: every start draws afresh, as GPU starts differ
    assert 0.035 < statistics.stdev(logs) < 0.065 and abs(statistics.mean(logs)) < 0.015
    seeded = EngineNoise(start_sd=0.05, seed=7)
    assert seeded.slowdown()(0.0) == seeded.slowdown()(0.0)  # a seed repeats the draws


def test_the_run_to_run_factor_changes_by_window_with_the_sd_asked_for():
    noise = EngineNoise(sd=0.1, window_s=5.0, seed=3)
    f = noise.slowdown()
    assert f(0.0) == f(4.99) != f(5.0) == f(9.0)
    logs = [math.log(f(5.0 * k + 1.0)) for k in range(4000)]
    assert 0.095 < statistics.stdev(logs) < 0.105 and abs(statistics.mean(logs)) < 0.01
    assert f(12.0) == noise.slowdown()(12.0)  # by window, not by the order of asking
    both = EngineNoise(start_sd=0.05, sd=0.1, seed=3).slowdown()
    start = EngineNoise(start_sd=0.05, seed=3).slowdown()(0.0)
    assert both(12.0) == pytest.approx(start * f(12.0))


def test_the_scheduler_multiplies_every_iteration_by_the_factor():
    model = _model()

    def durations(slowdown):
        sched = Scheduler(model, slowdown=slowdown)
        for i in range(4):
            sched.add(make_request(model, f"r{i}", 64, 12, temperature=0.0, seed=i))
        out, now = [], 0.0
        while sched.has_work():
            res = sched.step(now)
            out.append(res.duration)
            now += res.duration
        return out

    exact = durations(None)
    assert durations(lambda now: 2.0) == pytest.approx([2 * d for d in exact])


@pytest.mark.parametrize("bad", [dict(sd=-0.1), dict(start_sd=math.nan), dict(sd=3.0), dict(window_s=0.0),
                                 dict(sd=0.1, seed=-1), dict(sd=0.1, seed=1.5)])
def test_a_bad_setting_is_refused(bad):
    with pytest.raises(ValueError):
        EngineNoise(**bad)


def test_the_engine_refuses_a_bad_setting_and_reports_a_good_one(capsys):
    from orchestrator.sim.__main__ import main
    from orchestrator.sim.server import SimEngine

    assert main(["--profile", PROFILE, "--noise-sd", "5", "--log-level", "ERROR"]) == 2
    profile = load_profile(PROFILE)
    params = EngineParams(tp=profile.num_gpus, memory_fraction=0.5)
    assert SimEngine(profile, params).info()["noise"] is None
    noisy = SimEngine(profile, params, noise=EngineNoise(start_sd=0.05, sd=0.1))
    assert noisy.info()["noise"] == {"start_sd": 0.05, "sd": 0.1, "window_s": 5.0, "seed": None}
