"""Calibration and plausibility of the simulator's model, driven directly (no HTTP)."""
from __future__ import annotations

import pytest

from orchestrator.errors import OrchestratorError
from orchestrator.sim.model import (
    DEFAULT_PROFILE,
    EngineParams,
    PerformanceModel,
    SimModelError,
    SimOutOfMemory,
    emission_schedule,
    expected_accept_length,
    load_profile,
)
from orchestrator.sim.scheduler import Scheduler, make_request, simulate_workload
from orchestrator.sim.tokenizer import count_tokens, sample_text

PROFILE = load_profile(DEFAULT_PROFILE)
PUBLISHED = PROFILE.extra["published"]
BUCKETS = ["1024", "4096", "8192", "16000"]


def _run(output_len: int, n_draft: int, **kw):
    args = dict(input_len=1024, range_ratio=0.5, num_prompts=256, concurrency=64, seed=0)
    args.update(kw)
    return simulate_workload(PROFILE, n_draft, output_len=output_len, **args)


@pytest.mark.parametrize("bucket", BUCKETS)
def test_published_table_is_reproduced(bucket: str) -> None:
    off, on = _run(int(bucket), 0), _run(int(bucket), 3)
    pub = PUBLISHED[bucket]
    ratio, pub_ratio = on.output_throughput / off.output_throughput, pub["on"] / pub["off"]
    assert abs(ratio / pub_ratio - 1) <= 0.10, (bucket, ratio, pub_ratio)
    assert abs(on.accept_length - pub["accept_length"]) <= 0.15, (bucket, on.accept_length)
    assert off.accept_length is None
    assert on.total_output_tokens == off.total_output_tokens  # same workload, same token counts


def test_simulation_is_deterministic() -> None:
    assert _run(1024, 3, num_prompts=64) == _run(1024, 3, num_prompts=64)


def test_acceptance_falls_with_temperature_and_mtp_can_lose() -> None:
    a0, a1 = _run(2048, 3, num_prompts=128), _run(2048, 3, num_prompts=128, temperature=1.0)
    assert a1.accept_length < a0.accept_length - 0.5
    off = _run(1024, 0, num_prompts=128, temperature=1.0)
    hot = _run(1024, 3, num_prompts=128, temperature=1.0)
    assert hot.output_throughput < off.output_throughput  # at high temperature MTP loses


def test_small_memory_fraction_lowers_long_output_throughput() -> None:
    big = _run(8192, 3, num_prompts=128, memory_fraction=0.8)
    small = _run(8192, 3, num_prompts=128, memory_fraction=0.02)
    assert small.kv_capacity_tokens < big.kv_capacity_tokens
    assert small.mean_running < big.mean_running
    assert small.output_throughput < 0.9 * big.output_throughput


def test_more_drafts_past_the_sweet_spot_do_not_help() -> None:
    tput = {n: _run(4096, n, num_prompts=128).output_throughput for n in (1, 3, 5)}
    assert tput[3] > tput[1]
    assert tput[5] <= tput[3] * 1.02
    acc = {n: _run(4096, n, num_prompts=128).accept_length for n in (1, 3, 5)}
    assert acc[1] < acc[3] < acc[5] and acc[5] - acc[3] < acc[3] - acc[1]  # deeper drafts add less


def test_oom_at_start_when_memory_does_not_fit() -> None:
    with pytest.raises(SimOutOfMemory, match="CUDA out of memory"):
        PerformanceModel(PROFILE, EngineParams(tp=8, num_draft_tokens=3, memory_fraction=0.95))
    with pytest.raises(SimOutOfMemory, match="session-len"):
        PerformanceModel(PROFILE, EngineParams(tp=8, memory_fraction=0.001, session_len=131072))
    with pytest.raises(SimOutOfMemory, match="weights"):
        PerformanceModel(PROFILE, EngineParams(tp=2))


def test_model_errors_are_project_errors_and_value_errors() -> None:
    for exc in (OrchestratorError, ValueError, SimModelError):
        with pytest.raises(exc, match="profile"):
            load_profile("no-such-profile")


def test_tokenizer_counts_sampled_text_exactly() -> None:
    import random

    rng = random.Random(1)
    for n in (1, 7, 1024, 50_000):
        assert count_tokens(sample_text(n, rng)) == n


def test_acceptance_follows_the_decode_batch_only_in_a_profile_with_a_load_term() -> None:
    """The same 64 requests (same seeds, same draws) at concurrency 4 and 64: without a load term they
    accept exactly alike; with one, the larger batch accepts more, as the analytic figure says."""
    def accept(profile, concurrency):
        return simulate_workload(profile, 4, input_len=256, output_len=256, range_ratio=1.0, num_prompts=64,
                                 concurrency=concurrency, temperature=0.8, seed=1).accept_length

    flat = load_profile("qwen35-test-83m-1xh200")
    assert flat.accept_load_slope == 0.0 and accept(flat, 4) == accept(flat, 64)
    loaded = flat.replace(accept_load_slope=0.3)
    low, high = accept(loaded, 4), accept(loaded, 64)
    assert high > low + 0.3
    for concurrency, simulated in ((4, low), (64, high)):
        analytic = expected_accept_length(loaded, 4, 0.8, 256, 1.0, batch=concurrency)
        assert simulated == pytest.approx(analytic, abs=0.1)
    assert expected_accept_length(loaded, 4, 0.8, 256, 1.0, batch=64) == expected_accept_length(flat, 4, 0.8, 256, 1.0)


def test_the_engine_emits_a_sequences_schedule_step_by_step() -> None:
    """A lone request in the scheduler emits exactly its ``emission_schedule`` at batch 1: the draws are
    taken up front in the same order and applied step by step at the batch each step runs in."""
    import numpy as np

    profile = load_profile("qwen35-test-83m-1xh200").replace(accept_load_slope=0.3)
    model = PerformanceModel(profile, EngineParams(num_draft_tokens=3, memory_fraction=0.5))
    sched = Scheduler(model)
    sched.add(make_request(model, "r", 64, 300, temperature=0.8, seed=7))
    emitted = []
    while sched.has_work():
        emitted += [e for _, e, _ in sched.step().emissions]
    assert emitted[0] == 1 and sum(emitted) == 300  # the prefill's token, then the decode steps
    assert emitted[1:] == emission_schedule(profile, 3, 0.8, 300, np.random.default_rng(7), batch=1)
