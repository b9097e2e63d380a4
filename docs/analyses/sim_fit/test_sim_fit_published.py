"""The published Intern-S2 profile held against the MoE testbed (issue #22 item 4, second part): the pure parts of
``docs/analyses/sim_fit/sim_fit_published.py`` on hand-computed cases, and its committed result against what the stored
profile and the committed landscape give when the cheap parts are run again."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from docs.analyses.sim_fit import sim_fit_published as spf
from orchestrator.sim.model import EngineParams, Profile, load_profile

ROOT = Path(__file__).resolve().parents[3]

RESULT = json.loads((ROOT / "docs/analyses/sim_fit/sim_fit_published_2026-12-02.json").read_text())
PROFILE = load_profile(str(spf.PROFILE_PATH))
LANDSCAPE = json.loads((ROOT / RESULT["step_costs"]["testbed_source"]["landscape"]).read_text())  # what it was run on


def _tiny(**changes: float) -> Profile:
    """A dense one-GPU profile whose step is easy to compute by hand: 1 GB of target weights, 0.5 GB of MTP
    layer, 1 TB/s, 2 PFLOP/s, no KV read at context 0."""
    data = {
        "name": "tiny-hand", "notes": "test", "calibrated": False,
        "architecture": {"dense_params_b": 1.0, "expert_params_b": 0.0, "num_experts": 8, "experts_per_token": 1,
                         "weight_bytes_per_param": 1.0, "kv_bytes_per_token": 1000, "state_bytes_per_seq": 0,
                         "attn_flops_per_token_ctx": 0, "max_context": 4096, "default_session_len": 1024},
        "mtp": {"mtp_dense_params_b": 0.5, "mtp_expert_params_b": 0.0, "mtp_kv_bytes_per_token": 0,
                "mtp_memory_overhead_gb": 0.0, "safe_max_memory_fraction_mtp": 0.9},
        "hardware": {"num_gpus": 1, "gpu_memory_gb": 80.0, "reserved_memory_gb": 1.0, "hbm_tbps": 1.0,
                     "tflops": 2000.0, "safe_max_memory_fraction": 0.9, "default_max_batch_size": 64},
        "fitted": {"eff_bandwidth": 1.0, "eff_decode_flops": 1.0, "eff_prefill_flops": 1.0, "routing_spread": 1.0,
                   "verify_route_novelty": 1.0, "decode_overhead_ms": 1.0, "prefill_overhead_ms": 0.0,
                   "draft_overhead_ms": 0.5, "mtp_verify_overhead_ms": 0.25, "mtp_prefill_overhead_ms": 0.0},
        "acceptance": {"accept_p0": 0.8, "accept_log_slope": 0.0, "accept_pos_scale": 1000.0,
                       "accept_depth_penalty": 0.0, "accept_temperature_slope": 0.0, "eos_prob_per_token": 0.0},
    }
    return Profile.from_dict(data).replace(**changes)


def test_step_cost_ratio_by_hand_additive_and_overlapped():
    # 4 sequences, MTP-2, context 0. Plain: 1 ms weights + 4 tokens x 2e9 FLOP / 2e15 (4 us) + 1 ms host = 2.004 ms.
    # MTP-2: target 1 ms + 12 tokens (12 us) + 1 ms; verify 0.25 ms; 2 drafts x (0.5 ms + 2 us + 0.5 ms) = 4.266 ms.
    params = EngineParams(tp=1)
    assert spf.step_cost_ratio(_tiny(), params, 2, 4, 0.0) == pytest.approx(4.266 / 2.004, rel=1e-9)
    # host_overlap 1: the step is the larger part. Plain max(1.004 GPU, 1.0 host); MTP-2 max(2.016, 2.25).
    assert spf.step_cost_ratio(_tiny(host_overlap=1.0), params, 2, 4, 0.0) == pytest.approx(2.25 / 1.004, rel=1e-9)


def test_mean_decode_context_is_mean_prompt_plus_half_mean_output():
    assert spf.mean_decode_context(1024, 1024, 0.5) == 768 + 768 / 2
    assert spf.mean_decode_context(100, 200, 1.0) == 100 + 200 / 2


def _cell(n: int, c: int, tput: float, *, predicted: float | None = None, t: float = 0.0, o: int = 512,
          failed: int = 0) -> dict:
    return {"draft_tokens": n, "concurrency": c, "output_throughput": tput, "predicted_accept_length": predicted,
            "temperature": t, "output_len": o, "failed": failed}


def test_testbed_step_costs_are_predicted_accept_over_the_ratio_to_mtp_off():
    landscape = {"cells": {str(i): c for i, c in enumerate([
        _cell(0, 1, 100.0), _cell(2, 1, 150.0, predicted=3.0),  # 3.0 / 1.5 = 2.0
        _cell(0, 16, 400.0), _cell(2, 16, 200.0, predicted=2.5),  # 2.5 / 0.5 = 5.0
        _cell(3, 16, 999.0, predicted=3.0, failed=1),  # a run with a failed request: left out
        _cell(3, 64, 999.0, predicted=3.0),  # no MTP-off partner
        _cell(2, 1, 10.0, predicted=2.0, t=0.8), _cell(2, 1, 10.0, predicted=2.0, o=128),  # other workloads
    ])}}
    costs = spf.testbed_step_costs(landscape, 512, 0.0)
    assert costs == {"2": {"1": 2.0, "16": 5.0}}
    two_levels = {"cells": {**{k: {**c, "agreement": 0.7} for k, c in landscape["cells"].items()},
                            "x": {**_cell(2, 1, 300.0, predicted=3.0), "agreement": 0.9}}}
    with pytest.raises(ValueError, match="agreement levels"):
        spf.testbed_step_costs(two_levels, 512, 0.0)
    assert spf.testbed_step_costs(two_levels, 512, 0.0, 0.9) == {"2": {"1": 1.0}}  # MTP off's cells serve each level
    assert spf.cost_range(costs) == {"2": [2.0, 5.0]}


def _pub() -> dict:
    return {"1024": {"off": 100.0, "on": 120.0, "accept_length": 3.0}, "tpot_ms_1024": {"off": 10.0, "on": 4.0}}


def _sim(on: float, accept: float = 3.0, tpot_on: float = 4.0) -> dict:
    return {"1024": {"off": 100.0, "on": on, "accept_length": accept, "tpot_off_ms": 10.0, "tpot_on_ms": tpot_on}}


def test_table_errors_apply_the_reproduction_bar():
    assert spf.table_errors(_sim(130.0), _pub())["passes_bar"]  # ratio +8.3 %
    assert not spf.table_errors(_sim(133.0), _pub())["passes_bar"]  # ratio +10.8 %
    assert not spf.table_errors(_sim(120.0, accept=3.2), _pub())["passes_bar"]  # accept +0.2
    check = spf.table_errors(_sim(120.0, tpot_on=5.0), _pub())
    assert check["passes_bar"] and not check["tpot_within_10pct"]
    assert check["tpot"]["on_error"] == pytest.approx(0.25)
    assert check["log_rms"] == pytest.approx(math.log(1.25) / math.sqrt(3), abs=1e-4)  # residuals: ratio, off, on


def test_decode_share_and_implied_step_cost():
    bucket = {"off": 6400.0, "on": 12800.0, "accept_length": 3.2, "tpot_off_ms": 10.0, "tpot_on_ms": 4.0}
    assert spf.decode_share(bucket, 64) == {"off": 1.0, "on": 0.8}
    implied = spf.implied_step_costs({"1024": bucket}, {"1024": {}})
    assert implied == {"1024": 1.6, "tpot_1024": 1.28}


def _candidate(log_rms: float, *, bar: bool = True, tpot: bool = True, tput: float = 0.1, flops: float = 0.5) -> dict:
    return {"constants": {"eff_bandwidth": 0.9, "eff_decode_flops": flops},
            "check": {"log_rms": log_rms, "passes_bar": bar, "tpot_within_10pct": tpot,
                      "worst_abs_throughput_error": tput, "tpot": {"off_error": 0.0, "on_error": 0.0 if tpot else 0.2}}}


def test_decide_proposes_an_overlap_candidate_only_with_every_condition():
    current = {"log_rms": 0.10, "worst_abs_throughput_error": 0.15}
    assert decide_name(current, additive=_candidate(0.08), overlap_free=_candidate(0.05)) == "overlap_free"
    assert decide_name(current, additive=_candidate(0.04), overlap_free=_candidate(0.05)) is None  # no better than control
    assert decide_name(current, additive=_candidate(0.08), overlap_free=_candidate(0.05, tpot=False)) is None
    assert decide_name(current, additive=_candidate(0.08), overlap_free=_candidate(0.05, bar=False)) is None
    assert decide_name(current, additive=_candidate(0.08), overlap_free=_candidate(0.11)) is None  # worse than stored
    assert decide_name(current, additive=_candidate(0.08), overlap_free=_candidate(0.05, tput=0.2)) is None
    assert decide_name(current, additive=_candidate(0.08), overlap_free=_candidate(0.05, flops=1.0)) is None
    assert decide_name(current, additive=_candidate(0.01)) is None  # an additive refit is never proposed
    why = spf.decide(current, {"overlap_free": _candidate(0.05, flops=1.0, tpot=False)})["reasons_not"]["overlap_free"]
    assert any("eff_decode_flops" in w for w in why) and any("TPOT" in w for w in why)


def decide_name(current: dict, **candidates: dict) -> str | None:
    return spf.decide(current, candidates)["proposed_candidate"]


# ----- the committed result -----------------------------------------------------------------------------------

def test_committed_step_costs_are_the_stored_profiles_and_the_landscapes():
    costs = RESULT["step_costs"]
    for bucket, entry in costs["published_model"].items():
        ctx = spf.mean_decode_context(spf.WORKLOAD["input_len"], int(bucket), spf.WORKLOAD["range_ratio"])
        assert entry["context_per_seq"] == ctx
        assert entry["ratios"] == spf.step_cost_table(PROFILE, EngineParams(tp=PROFILE.num_gpus), ctx)
    src = spf.TESTBED_STEP_COST_SOURCE
    assert costs["testbed_measured"] == spf.testbed_step_costs(LANDSCAPE, src["output_len"], src["temperature"],
                                                               src.get("agreement"))
    assert costs["testbed_measured_range"] == spf.cost_range(costs["testbed_measured"])


def test_committed_check_of_the_stored_profile_is_reproduced():
    published = spf.published_table(PROFILE)
    assert RESULT["published"] == published
    assert RESULT["current"]["constants"] == {k: getattr(PROFILE, k) for k in (*spf.FITTED, "host_overlap")}
    short = {"1024": published["1024"]}  # the cheapest bucket, rerun at the check's prompts
    assert spf.simulate_table(PROFILE, short, spf.CHECK_PROMPTS)["1024"] == RESULT["current"]["sim"]["1024"]
    assert spf.table_errors(RESULT["current"]["sim"], published) == RESULT["current"]["check"]


def test_committed_candidates_and_decision_follow_from_their_figures():
    published = RESULT["published"]
    for c in RESULT["candidates"].values():
        assert spf.table_errors(c["sim"], published) == c["check"]
        for k, v in c["constants"].items():
            if k in c["bounds"]:
                assert c["bounds"][k][0] <= v <= c["bounds"][k][1]
    assert spf.decide(RESULT["current"]["check"], RESULT["candidates"]) == RESULT["decision"]
    assert (RESULT["proposed_profile_changes"] is None) is (not RESULT["decision"]["change_profile"])
    assert RESULT["simulated"] is True
