"""The simulator's sampling cost (``sampling_overhead_ms``): at 0 (every shipped profile) a step is bit for bit
what it was; a step in which any sequence samples costs exactly the term more, as host time; the scheduler
counts its sampled decoding sequences, so greedy runs never pay; bad values are refused."""
from __future__ import annotations

import json
import math

import pytest

from orchestrator.errors import OrchestratorError
from orchestrator.sim.model import (
    BACKEND_CONSTANTS,
    PROFILES_DIR,
    SAMPLING_CONSTANTS,
    EngineParams,
    PerformanceModel,
    SimModelError,
    list_profiles,
    load_profile,
)
from orchestrator.sim.scheduler import Scheduler, make_request, simulate_workload

TESTBED = "qwen35-moe-testbed-1xh200"
LOADS = [(1, 600), (16, 16 * 700), (256, 256 * 800)]
COST_MS = 0.7
RUN = {"input_len": 512, "output_len": 128, "range_ratio": 1.0, "num_prompts": 16, "concurrency": 8, "tp": 1,
       "memory_fraction": 0.5, "max_batch_size": 256, "session_len": 1088}


def _model(profile, drafts: int) -> PerformanceModel:
    return PerformanceModel(profile, EngineParams(tp=profile.num_gpus, num_draft_tokens=drafts, memory_fraction=0.5,
                                                  max_batch_size=256, session_len=2048))


@pytest.mark.parametrize("name", list_profiles())
def test_a_profile_without_a_sampling_cost_steps_sampled_as_greedy_bit_for_bit(name):
    profile = load_profile(name).replace(sampling_overhead_ms=0.0)  # a fitted profile may carry one: its fit's test
    assert SAMPLING_CONSTANTS == ("sampling_overhead_ms",)
    for drafts in (0, 3):
        model = _model(profile, drafts)
        for n, ctx in LOADS:
            greedy = model.decode_time(n, ctx)
            assert model.decode_time(n, ctx, num_sampled=n) == greedy  # exact, not approx
            assert model.decode_time(n, ctx, num_sampled=1) == greedy
            assert model.decode_parts(n, ctx, num_sampled=n) == model.decode_parts(n, ctx)


@pytest.mark.parametrize("drafts", [0, 1, 3])
@pytest.mark.parametrize(("n", "ctx"), LOADS)
def test_a_sampled_step_costs_exactly_the_term_more_as_host_time(drafts, n, ctx):
    base = load_profile(TESTBED).replace(host_overlap=0.0)
    plain, costly = _model(base, drafts), _model(base.replace(sampling_overhead_ms=COST_MS), drafts)
    gpu, host = plain.decode_parts(n, ctx)
    # greedy steps do not pay, whatever the term
    assert costly.decode_time(n, ctx) == plain.decode_time(n, ctx)
    assert costly.decode_parts(n, ctx) == (gpu, host)
    for sampled in (1, n):  # one sampling sequence puts the whole batch on the sampled path, as LMDeploy's sampler
        g, h = costly.decode_parts(n, ctx, num_sampled=sampled)
        assert g == gpu
        assert h - host == pytest.approx(COST_MS / 1e3, rel=1e-9)
        assert costly.decode_time(n, ctx, num_sampled=sampled) - plain.decode_time(n, ctx) == pytest.approx(
            COST_MS / 1e3, rel=1e-9)
    assert costly.decode_time(0, 0) == 0.0


def test_with_overlap_the_term_is_host_time_it_shows_where_the_host_part_is_larger_and_hides_where_not():
    base = load_profile(TESTBED).replace(host_overlap=1.0)  # the step is the larger part
    model, costly = _model(base, 0), _model(base.replace(sampling_overhead_ms=0.5), 0)
    g1, h1 = model.decode_parts(1, 600)
    assert h1 > g1  # concurrency 1: host-bound, the whole cost shows
    assert costly.decode_time(1, 600, num_sampled=1) == pytest.approx(h1 + 0.5e-3, rel=1e-12)
    g256, h256 = model.decode_parts(256, 256 * 800)
    assert g256 > h256 + 0.5e-3  # concurrency 256: GPU-bound, the cost hides
    assert costly.decode_time(256, 256 * 800, num_sampled=256) == pytest.approx(g256, rel=1e-12)


@pytest.mark.parametrize("bad", [-1, 5])
def test_a_sampled_count_outside_the_batch_is_refused(bad):
    with pytest.raises(SimModelError, match=r"num_sampled=.*allowed: an integer in 0\.\.num_seqs"):
        _model(load_profile(TESTBED), 0).decode_time(4, 2400, num_sampled=bad)


def test_the_simulated_benchmark_pays_the_cost_only_on_sampled_requests():
    base = load_profile(TESTBED)
    costly = base.replace(sampling_overhead_ms=COST_MS)
    for drafts in (0, 2):
        greedy_plain = simulate_workload(base, drafts, temperature=0.0, **RUN)
        greedy_costly = simulate_workload(costly, drafts, temperature=0.0, **RUN)
        assert greedy_costly == greedy_plain  # greedy runs are unchanged by the term
        sampled_plain = simulate_workload(base, drafts, temperature=0.8, **RUN)
        sampled_costly = simulate_workload(costly, drafts, temperature=0.8, **RUN)
        assert sampled_costly.steps == sampled_plain.steps and sampled_costly.completed == 16
        assert sampled_costly.tpot_ms_median > sampled_plain.tpot_ms_median
        assert sampled_costly.output_throughput < sampled_plain.output_throughput


def test_the_scheduler_counts_its_sampled_decoding_sequences_and_charges_their_steps():
    profile = load_profile(TESTBED).replace(host_overlap=0.0, sampling_overhead_ms=COST_MS)
    model = _model(profile, 0)
    sched = Scheduler(model)
    reqs = [make_request(model, f"r{i}", 64, 6 + i, temperature=t, seed=i)
            for i, t in enumerate([0.8, 1.0, 0.0, 0.0])]
    assert [r.sampled for r in reqs] == [True, True, False, False]
    for r in reqs:
        sched.add(r)
    seen, now = [], 0.0
    while sched.has_work():
        n, ctx, sampled = len(sched.decoding), sched.decode_context, sched.decode_sampled
        assert sampled == sum(r.sampled for r in sched.decoding)  # the counter is the scan it saves
        prefilling = sum(r.prefill_remaining for r in sched.prefilling)
        res = sched.step(now)
        now += res.duration
        if n and not prefilling:
            assert res.duration == model.decode_time(n, ctx, num_sampled=sampled)
            seen.append(sampled)
    assert sched.decode_sampled == 0
    assert 2 in seen and 1 in seen and 0 in seen  # the sampled (shorter) ones finish first, one by one
    # a cancelled sampled sequence leaves the count
    sched2 = Scheduler(model)
    r = make_request(model, "c", 64, 50, temperature=0.8)
    sched2.add(r)
    sched2.step()
    assert sched2.decode_sampled == 1
    sched2.cancel(r)
    assert sched2.decode_sampled == 0 and not sched2.has_work()


@pytest.mark.parametrize("bad", [-0.01, math.nan, math.inf, "0.5", None, True])
def test_a_bad_sampling_cost_is_refused_with_what_is_allowed(bad):
    with pytest.raises(SimModelError, match=r"sampling_overhead_ms=.*allowed: a finite number >= 0") as info:
        load_profile(TESTBED).replace(sampling_overhead_ms=bad)
    assert isinstance(info.value, OrchestratorError)


def test_a_profile_file_may_set_the_term_and_a_turbomind_section_its_own(tmp_path):
    data = json.loads((PROFILES_DIR / "qwen35-test-83m-1xh200.json").read_text())
    good, bad, inherit = tmp_path / "good.json", tmp_path / "bad.json", tmp_path / "inherit.json"
    good.write_text(json.dumps({**data, "fitted": {**data["fitted"], "sampling_overhead_ms": COST_MS},
                                "turbomind": {**data["turbomind"], "sampling_overhead_ms": 0.1}}))
    inherit.write_text(json.dumps({**data, "fitted": {**data["fitted"], "sampling_overhead_ms": COST_MS}}))
    bad.write_text(json.dumps({**data, "fitted": {**data["fitted"], "sampling_overhead_ms": -2}}))
    assert "sampling_overhead_ms" in BACKEND_CONSTANTS
    assert load_profile(str(good)).sampling_overhead_ms == COST_MS
    assert load_profile(str(good)).for_backend("turbomind").sampling_overhead_ms == 0.1
    assert load_profile(str(inherit)).for_backend("turbomind").sampling_overhead_ms == COST_MS
    with pytest.raises(SimModelError, match="sampling_overhead_ms=-2"):
        load_profile(str(bad))


def test_the_sampled_count_must_be_a_whole_number_of_the_steps_sequences():
    model = _model(load_profile(list_profiles()[0]), 0)
    for bad in (True, 0.5, -1, 2):
        with pytest.raises(SimModelError, match="num_sampled"):
            model.decode_time(1, 600, num_sampled=bad)
    with pytest.raises(SimModelError, match="num_sampled"):
        model.decode_time(0, 0, num_sampled=3)  # an empty step has nothing to sample
    assert model.decode_time(0, 0, num_sampled=0) == 0.0
