"""Calibration and plausibility of the simulator's model, driven directly (no HTTP)."""
from __future__ import annotations

import pytest

from orchestrator.errors import OrchestratorError
from orchestrator.sim.model import DEFAULT_PROFILE, EngineParams, PerformanceModel, SimModelError, SimOutOfMemory, load_profile
from orchestrator.sim.scheduler import simulate_workload
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
