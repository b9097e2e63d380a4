"""Simulated engines that share one GPU (:mod:`orchestrator.sim.gpu_share`): an engine's iteration takes as
many times longer as engines are busy on the GPU at its start, and an idle or stopped engine costs the
others nothing."""
from __future__ import annotations

import time

import pytest

from orchestrator.sim.gpu_share import SharedGpu, time_slice_factor
from orchestrator.sim.model import EngineParams, load_profile
from orchestrator.sim.scheduler import make_request
from orchestrator.sim.server import SimEngine

PROFILE = "tiny-qwen35-1xh200"


def test_the_factor_counts_the_other_engines_busy_at_the_start():
    busy = {"a": 10.0, "b": 12.0, "c": 0.0, "d": 9.0}
    assert time_slice_factor(busy, "a", now=9.5) == 2  # b busy; c idle; d done; a itself not counted
    assert time_slice_factor(busy, "c", now=9.5) == 3
    assert time_slice_factor(busy, "a", now=20.0) == 1
    assert time_slice_factor({}, "a", now=0.0) == 1


def test_engines_sharing_a_directory_see_each_other_busy_and_idle(tmp_path):
    a, b = SharedGpu(tmp_path, "a", refresh_s=0.0), SharedGpu(tmp_path, "b", refresh_s=0.0)
    assert a.factor() == b.factor() == 1  # both idle
    a.busy_until(time.time() + 60)
    assert b.factor() == 2 and a.factor() == 1
    a.busy_until(0.0)
    assert b.factor() == 1
    a.busy_until(time.time() + 60)
    a.close()
    assert b.factor() == 1 and sorted(p.name for p in tmp_path.glob("*.busy")) == ["b.busy"]
    with pytest.raises(ValueError, match="letters and digits"):
        SharedGpu(tmp_path, "../x")


def test_a_simulated_engine_beside_a_busy_one_takes_twice_as_long_per_iteration(tmp_path):
    profile = load_profile(PROFILE)
    params = EngineParams(tp=1, memory_fraction=0.3)
    other = SharedGpu(tmp_path, "other", refresh_s=0.0)
    alone = SimEngine(profile, params)
    shared = SimEngine(profile, params, shared_gpu=SharedGpu(tmp_path, "me", refresh_s=0.0))

    def first_steps(engine: SimEngine) -> list[float]:
        engine.scheduler.add(make_request(engine.model, "r", 512, 64))
        return [engine.scheduler.step(0.0).duration for _ in range(3)]

    other.busy_until(time.time() + 60)
    assert first_steps(shared) == pytest.approx([2 * d for d in first_steps(alone)])
    other.busy_until(0.0)
    assert shared.scheduler.step(0.0).duration == pytest.approx(alone.scheduler.step(0.0).duration)
