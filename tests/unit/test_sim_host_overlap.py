"""The simulator's host/GPU overlap (``host_overlap``): 0 keeps every profile's additive step, 1 makes a decode
step the larger of its host and GPU parts, the MTP step overlaps as one unit, prefill stays a sum, and a value
outside 0..1 is refused with a clear error."""
from __future__ import annotations

import itertools
import json
import math

import pytest

from orchestrator.errors import OrchestratorError
from orchestrator.sim.model import (
    BACKEND_CONSTANTS,
    PROFILES_DIR,
    EngineParams,
    PerformanceModel,
    SimModelError,
    list_profiles,
    load_profile,
)
from orchestrator.sim.scheduler import simulate_workload

HOST_TERMS = ("decode_overhead_ms", "decode_overhead_per_seq_ms", "mtp_verify_overhead_ms", "draft_overhead_ms")
LOADS = [(1, 600), (16, 16 * 700), (256, 256 * 800)]


def _model(profile, drafts: int) -> PerformanceModel:
    return PerformanceModel(profile, EngineParams(tp=profile.num_gpus, num_draft_tokens=drafts, memory_fraction=0.5,
                                                  max_batch_size=256, session_len=2048))


def _cases():
    for name in list_profiles():
        for drafts in (0, 3):
            for n, ctx in LOADS:
                yield pytest.param(name, drafts, n, ctx, id=f"{name}-mtp{drafts}-c{n}")


@pytest.mark.parametrize(("name", "drafts", "n", "ctx"), list(_cases()))
def test_the_parts_are_the_gpu_terms_and_the_host_overheads_and_zero_overlap_adds_them(name, drafts, n, ctx):
    profile = load_profile(name).replace(host_overlap=0.0)
    model = _model(profile, drafts)
    gpu, host = model.decode_parts(n, ctx)
    # the GPU part is the step with every host overhead at 0; the host part is what those overheads add
    no_host = _model(profile.replace(**dict.fromkeys(HOST_TERMS, 0.0)), drafts)
    assert gpu == pytest.approx(no_host.decode_time(n, ctx), rel=1e-12)
    expected_host = (profile.decode_overhead_ms + profile.decode_overhead_per_seq_ms * n
                     + (profile.mtp_verify_overhead_ms + drafts * profile.draft_overhead_ms if drafts else 0.0)) / 1e3
    assert host == pytest.approx(expected_host, rel=1e-12)
    assert model.decode_time(n, ctx) == pytest.approx(gpu + host, rel=1e-12)
    assert model.decode_time(0, 0) == 0.0 and model.decode_parts(0, 0) == (0.0, 0.0)


@pytest.mark.parametrize(("name", "drafts", "n", "ctx"), list(_cases()))
def test_full_overlap_is_the_larger_part_and_the_step_shrinks_with_the_overlap(name, drafts, n, ctx):
    base = load_profile(name)
    gpu, host = _model(base, drafts).decode_parts(n, ctx)
    steps = [_model(base.replace(host_overlap=x), drafts).decode_time(n, ctx) for x in (0.0, 0.25, 0.5, 1.0)]
    assert steps[-1] == pytest.approx(max(gpu, host), rel=1e-12)
    assert steps[0] == pytest.approx(gpu + host, rel=1e-12)
    assert steps[2] == pytest.approx(gpu + host - 0.5 * min(gpu, host), rel=1e-12)
    assert all(a > b for a, b in itertools.pairwise(steps))  # every part is positive, so each share hides more


def test_the_mtp_step_overlaps_as_one_unit_its_draft_passes_in_both_sums():
    profile = load_profile("qwen35-moe-testbed-1xh200").replace(host_overlap=1.0)
    one, three = _model(profile, 1), _model(profile, 3)
    (g1, h1), (g3, h3) = one.decode_parts(16, 16 * 700), three.decode_parts(16, 16 * 700)
    draft_gpu = three.draft_step_time(16, 16 * 700) - profile.draft_overhead_ms / 1e3
    # two more draft passes add their GPU time to the GPU part and their overhead to the host part (the
    # verification's tokens grow too, so the GPU part grows by at least the passes)
    assert h3 - h1 == pytest.approx(2 * profile.draft_overhead_ms / 1e3, rel=1e-9)
    assert g3 - g1 >= 2 * draft_gpu
    assert three.decode_time(16, 16 * 700) == pytest.approx(max(g3, h3), rel=1e-12)
    # one draft pass on its own is reported added: the overlap is the whole step's
    additive = _model(profile.replace(host_overlap=0.0), 3)
    assert three.draft_step_time(16, 16 * 700) == additive.draft_step_time(16, 16 * 700)


def test_prefill_stays_a_sum():
    base = load_profile("qwen35-moe-testbed-1xh200")
    for drafts in (0, 2):
        a, b = _model(base.replace(host_overlap=0.0), drafts), _model(base.replace(host_overlap=1.0), drafts)
        assert a.prefill_time(4096, 4096 * 2048.0) == b.prefill_time(4096, 4096 * 2048.0)


def test_the_simulated_benchmark_runs_faster_when_host_work_hides():
    base = load_profile("qwen35-moe-testbed-1xh200")
    kw = {"input_len": 512, "output_len": 128, "range_ratio": 1.0, "num_prompts": 8, "concurrency": 4, "tp": 1,
          "memory_fraction": 0.5, "max_batch_size": 256, "session_len": 1088}
    summed = simulate_workload(base.replace(host_overlap=0.0), 2, **kw)
    hidden = simulate_workload(base.replace(host_overlap=1.0), 2, **kw)
    assert summed.completed == hidden.completed == 8
    assert hidden.output_throughput > summed.output_throughput


@pytest.mark.parametrize("bad", [-0.01, 1.5, math.nan, math.inf, "0.5", None, True])
def test_a_bad_overlap_is_refused_with_what_is_allowed(bad):
    with pytest.raises(SimModelError, match=r"host_overlap=.*allowed: a number in 0\.\.1") as info:
        load_profile("qwen35-moe-testbed-1xh200").replace(host_overlap=bad)
    assert isinstance(info.value, OrchestratorError)


def test_a_profile_file_with_a_bad_overlap_is_refused_and_a_good_one_loads(tmp_path):
    data = json.loads((PROFILES_DIR / "qwen35-test-83m-1xh200.json").read_text())
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps({**data, "fitted": {**data["fitted"], "host_overlap": 0.75}}))
    bad.write_text(json.dumps({**data, "fitted": {**data["fitted"], "host_overlap": 2}}))
    assert load_profile(str(good)).host_overlap == 0.75
    with pytest.raises(SimModelError, match="host_overlap=2"):
        load_profile(str(bad))


def test_a_turbomind_section_may_set_its_own_overlap_and_otherwise_keeps_the_pytorch_one():
    assert "host_overlap" in BACKEND_CONSTANTS
    base = load_profile("qwen35-test-83m-1xh200")
    section = dict(base.extra["turbomind"])
    inherits = base.replace(host_overlap=0.4, extra={**base.extra, "turbomind": section})
    own = base.replace(host_overlap=0.4, extra={**base.extra, "turbomind": {**section, "host_overlap": 0.9}})
    assert inherits.for_backend("turbomind").host_overlap == 0.4
    assert own.for_backend("turbomind").host_overlap == 0.9
    bad = base.replace(extra={**base.extra, "turbomind": {**section, "host_overlap": 1.2}})
    with pytest.raises(SimModelError, match="host_overlap=1.2"):
        bad.for_backend("turbomind")
