"""The simulator understands vLLM's draft schedule (num_speculative_tokens_per_batch_size): each decode
step drafts the length its batch size's range says, costs what a fixed engine of that length costs, and
counts its drafts as vLLM does."""
from __future__ import annotations

import pytest

from orchestrator.sim.__main__ import _engine_settings, build_parser
from orchestrator.sim.model import (
    EngineParams,
    PerformanceModel,
    SimModelError,
    load_profile,
)
from orchestrator.sim.scheduler import simulate_workload

PROFILE = "intern-s2-preview-8xh200"
SCHEDULE = ((1, 4, 3), (5, 64, 0))


def _params(**kw) -> EngineParams:
    return EngineParams(**{"tp": 8, "backend": "vllm", "max_batch_size": 64, **kw})


def test_a_steps_cost_is_the_fixed_engines_at_the_scheduled_length() -> None:
    profile = load_profile(PROFILE)
    scheduled = PerformanceModel(profile, _params(num_draft_tokens=3, draft_schedule=SCHEDULE))
    mtp3 = PerformanceModel(profile, _params(num_draft_tokens=3))
    off = PerformanceModel(profile, _params(num_draft_tokens=0))
    assert [scheduled.draft_tokens_at(b) for b in (1, 4, 5, 64, 100)] == [3, 3, 0, 0, 0]
    assert scheduled.decode_time(4, 8000) == mtp3.decode_time(4, 8000)
    assert scheduled.decode_time(32, 64000) == off.decode_time(32, 64000)


def test_the_schedule_drafts_at_low_load_and_not_at_high_load() -> None:
    def run(concurrency: int, num_prompts: int, **kw):
        return simulate_workload(PROFILE, input_len=256, output_len=256, num_prompts=num_prompts,
                                 concurrency=concurrency, params=_params(**kw))

    low, fixed_low = run(2, 8, num_draft_tokens=3, draft_schedule=SCHEDULE), run(2, 8, num_draft_tokens=3)
    # never more than 4 in flight: every step drafts 3, the same draws as the fixed engine's
    assert (low.output_throughput, low.accept_length, low.drafts) == (
        fixed_low.output_throughput, fixed_low.accept_length, fixed_low.drafts)
    high, fixed_high = run(32, 64, num_draft_tokens=3, draft_schedule=SCHEDULE), run(32, 64, num_draft_tokens=3)
    # 32 in flight: only the tail's steps (4 or fewer sequences left) draft
    assert 0 < high.drafts < 0.1 * fixed_high.drafts and high.draft_tokens == 3 * high.drafts
    assert high.steps > fixed_high.steps  # one token per sequence per step where it does not draft


def test_bad_schedules_are_refused() -> None:
    with pytest.raises(SimModelError, match="longest draft length"):
        _params(num_draft_tokens=4, draft_schedule=SCHEDULE)
    with pytest.raises(SimModelError, match="needs backend vllm"):
        EngineParams(tp=8, num_draft_tokens=3, draft_schedule=SCHEDULE)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--backend", "vllm", "--speculative-config",
                                   '{"method":"mtp","num_speculative_tokens":3,'
                                   '"num_speculative_tokens_per_batch_size":[[2,4,3]]}'])


def test_the_command_line_carries_the_schedule_to_the_model() -> None:
    args = _engine_settings(build_parser().parse_args([
        "--backend", "vllm", "--speculative-config",
        '{"method":"mtp","num_speculative_tokens":3,"num_speculative_tokens_per_batch_size":[[1,4,3],[5,64,0]]}']))
    assert args.draft_schedule == SCHEDULE and args.speculative_num_draft_tokens == 3
