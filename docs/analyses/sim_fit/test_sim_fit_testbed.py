"""The MoE-testbed profile and its fit (issue #22 item 4): the split rule, cells built from landscape files, the
architecture counted from the preset's shape, the stored profile against its committed held-out check, and a
fit that recovers constants a simulated landscape was made with."""
from __future__ import annotations

import copy
import json
import math
import statistics
from pathlib import Path

import pytest

from docs.analyses.sim_fit import sim_fit_testbed as testbed
from orchestrator.sim.model import Profile, list_profiles, load_profile
from orchestrator.sim.scheduler import simulate_workload
from tuning.checkpoint.build import PRESETS, ModelShape, make_config
from tuning.checkpoint.footprint import footprint
from tuning.checkpoint.tokenizer import SPECIAL_TOKENS
from tuning.simfit import (
    ACCEPT_TOLERANCE,
    THROUGHPUT_TOLERANCE,
    SimFitError,
    WaveSetup,
    check_cells,
    landscape_cells,
    simulate_cell,
)

ROOT = Path(__file__).resolve().parents[3]

RESULT = json.loads(Path(f"{testbed.OUT_PREFIX}.json").read_text())  # the stored profile's fit
LANDSCAPE_PATH = ROOT / RESULT["measurements"][0]
PROFILE = load_profile(testbed.PROFILE_NAME)
SETUP = WaveSetup(**RESULT["setup"])
CELLS = {c.name: c for c in landscape_cells([json.loads(LANDSCAPE_PATH.read_text())], testbed.TESTBED_SPLIT)}


def _cell(engine: str, n: int, o: int, t: float, c: int, tput: float, *, accept: float | None = None,
          agreement: float | None = 0.7, failed: int = 0, drafts: float = 0.0) -> dict:
    return {"engine": engine, "agreement": agreement if n else None, "draft_tokens": n, "output_len": o,
            "temperature": t, "concurrency": c, "output_throughput": tput, "completed": max(4, 2 * c) - failed,
            "failed": failed, "accept_length": accept,
            "spec_counters": {"num_drafts": drafts, "num_draft_tokens": drafts * n, "num_accepted_tokens": 0.0}}


def _landscape(*cells: dict, input_len: int = 512) -> dict:
    return {"simulated": False, "preset": testbed.PRESET, "input_len": input_len, "commands": ["python x.py"],
            "cells": {f"{c['engine']}|out{c['output_len']}|T{c['temperature']:g}|c{c['concurrency']}": c for c in cells}}


@pytest.mark.parametrize(("n", "c", "held"), [(0, 1, False), (0, 4, True), (0, 16, False), (0, 64, True),
                                              (0, 256, False), (1, 256, False), (2, 1, True), (2, 256, True),
                                              (3, 16, False), (4, 1, False), (4, 64, True)])
def test_the_split_holds_out_concurrency_4_and_64_and_every_mtp2_cell(n, c, held):
    for t in (0.0, 0.8):
        assert testbed.TESTBED_SPLIT.held_out(n, c, t) is held


def test_the_committed_landscape_splits_into_fit_and_held_out_as_the_result_says():
    held = {name for name, c in CELLS.items() if c.held_out}
    assert len(RESULT["measurements"]) == 1 and Path(ROOT / RESULT["measurements"][0]) == testbed.MEASUREMENT
    assert len(CELLS) == 260 and len(held) == 140 == RESULT["held_out_cells"]
    assert held == {e["cell"] for e in RESULT["held_out"]}
    assert set(CELLS) - held == {e["cell"] for e in RESULT["fit"]}
    assert RESULT["split_rule"] == testbed.TESTBED_SPLIT.rule


def test_landscape_files_pool_by_cell_key_each_file_one_round():
    a = _landscape(_cell("mtp-off", 0, 128, 0.0, 4, 400.0),
                   _cell("a0.7-mtp2", 2, 128, 0.0, 4, 500.0, accept=2.1, drafts=16.0))
    b = _landscape(_cell("mtp-off", 0, 128, 0.0, 4, 600.0),
                   _cell("a0.7-mtp2", 2, 128, 0.0, 4, 900.0, accept=2.3, failed=1, drafts=20.0),
                   _cell("a0.7-mtp2", 2, 512, 0.8, 1, 150.0, accept=1.3, drafts=0.0))
    cells = {c.name: c for c in landscape_cells([a, b], testbed.TESTBED_SPLIT)}
    off = cells["mtp-off o128 c4 T0 n8"]
    assert off.throughputs == (400.0, 600.0) and off.throughput == 500.0 and off.requests == 8
    assert off.agreement is None and off.accept_length is None and off.held_out
    mtp = cells["a0.7-mtp2 o128 c4 T0 n8"]  # b's run had a failed request: left out, counted as excluded
    assert mtp.throughputs == (500.0,) and mtp.accept_lengths == (2.1,) and mtp.excluded_waves == 1
    assert mtp.counted_outputs == pytest.approx(16.0 / 8) and mtp.agreement == 0.7
    lone = cells["a0.7-mtp2 o512 c1 T0.8 n4"]  # counters that saw no step: no counted outputs
    assert lone.counted_outputs is None and lone.num_draft_tokens == 2
    assert mtp.to_dict()["agreement"] == 0.7 and "agreement" not in off.to_dict()
    seeded = _landscape(*a["cells"].values(), _cell("mtp-off", 0, 512, 0.0, 4, 700.0))  # the next lease's file
    with pytest.raises(SimFitError, match="same run is in an earlier file"):
        landscape_cells([a, seeded], testbed.TESTBED_SPLIT)
    assert len(landscape_cells([seeded], testbed.TESTBED_SPLIT)) == 3


def test_bad_landscapes_are_refused_with_what_is_wrong():
    good = _cell("mtp-off", 0, 128, 0.0, 4, 400.0)
    with pytest.raises(SimFitError, match="SIMULATED"):
        landscape_cells([{**_landscape(good), "simulated": True}], testbed.TESTBED_SPLIT)
    broken = {k: v for k, v in good.items() if k != "output_throughput"}
    with pytest.raises(SimFitError, match=r"lacks \['output_throughput'\]"):
        landscape_cells([_landscape(broken)], testbed.TESTBED_SPLIT)
    with pytest.raises(SimFitError, match="no 'cells'"):
        landscape_cells([{"rows": []}], testbed.TESTBED_SPLIT)
    with pytest.raises(SimFitError, match="without failed requests"):
        landscape_cells([_landscape({**good, "failed": 1})], testbed.TESTBED_SPLIT)
    with pytest.raises(SimFitError, match="differ in engine flags or workload"):
        testbed.setup_of([_landscape(good), _landscape(good, input_len=1024)])


def test_the_setup_is_the_landscape_engines_flags():
    setup = testbed.setup_of([json.loads(LANDSCAPE_PATH.read_text())])
    assert setup == WaveSetup(input_len=512, memory_fraction=0.5, max_batch_size=256, session_len=512 + 512 + 64,
                              max_prefill_tokens=8192)
    assert setup == SETUP


@pytest.mark.parametrize("experts", [0, 8])
def test_the_footprint_counts_every_tensor_the_builder_draws(experts):
    pytest.importorskip("torch")
    from tuning.checkpoint.build import make_weights

    shape = ModelShape(hidden_size=64, num_layers=4, vocab_size=512, num_heads=4, num_kv_heads=2, head_dim=64,
                       linear_num_key_heads=2, linear_num_value_heads=4, linear_head_dim=64, intermediate_size=96,
                       num_experts=experts, num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=48)
    weights = make_weights(make_config(shape, 512, {t: i for i, t in enumerate(SPECIAL_TOKENS)}))
    counts = dict.fromkeys(("vision", "mtp_experts", "mtp", "experts", "dense"), 0)
    for name, tensor in weights.items():
        kind = ("vision" if name.startswith("model.visual") else
                ("mtp_experts" if ".experts." in name else "mtp") if name.startswith("mtp.") else
                "experts" if ".experts." in name else "dense")
        counts[kind] += tensor.numel()
    f = footprint(shape)
    assert (f.dense_params, f.expert_params, f.mtp_dense_params, f.mtp_expert_params, f.vision_params) == (
        counts["dense"], counts["experts"], counts["mtp"], counts["mtp_experts"], counts["vision"])
    assert (f.expert_params > 0) is (experts > 0)


def test_the_testbed_footprint_is_the_preset_s_23_gb_and_the_profile_holds_it():
    f = footprint(PRESETS[testbed.PRESET])
    assert f.total_bytes == pytest.approx(23.1e9, rel=0.005)  # issue #22: "23.1 GB bf16"
    assert f.kv_bytes_per_token == 3 * 2 * 2 * 256 * 2 and f.mtp_kv_bytes_per_token == 2 * 2 * 256 * 2
    assert f.state_bytes_per_seq == 9 * (8192 * 4 + 32 * 128 * 128) * 2
    assert (f.num_experts, f.experts_per_token) == (256, 8)
    stored = json.loads(testbed.PROFILE.read_text())
    for section, values in testbed.architecture().items():
        assert {k: stored[section][k] for k in values} == values, section
    assert PROFILE.total_params_b == pytest.approx((f.dense_params + f.expert_params) / 1e9)


def test_the_profile_is_listed_loads_and_simulates_more_tokens_per_step_with_mtp():
    assert testbed.PROFILE_NAME in list_profiles()
    assert PROFILE.calibrated is False and "SIMULATED" in PROFILE.notes and RESULT["results_md"] in PROFILE.notes
    kw = dict(input_len=512, output_len=128, range_ratio=1.0, num_prompts=32, concurrency=16, tp=1,
              memory_fraction=0.5, max_batch_size=256, session_len=1088)
    off, mtp = simulate_workload(PROFILE, 0, **kw), simulate_workload(PROFILE, 2, **kw)
    assert off.completed == mtp.completed == 32 and off.accept_length in (None, 1.0)
    assert 1.5 < mtp.accept_length < 3.0
    assert testbed.at_agreement(PROFILE, 0.5).accept_p0 < testbed.at_agreement(PROFILE, 0.9).accept_p0
    with pytest.raises(SimFitError, match="no acceptance for agreement 0.6"):
        testbed.at_agreement(PROFILE, 0.6)  # a level no landscape measured


def test_the_stored_profile_holds_the_fitted_constants_the_result_claims():
    for name, value in {**RESULT["fitted"], **RESULT["held"]}.items():
        assert getattr(PROFILE, name) == pytest.approx(value, rel=1e-9), name
    level = RESULT["acceptance"][f"{PROFILE.extra['agreement']:g}"]
    for name, value in {**level, **RESULT["held_acceptance"]}.items():
        assert getattr(PROFILE, name) == pytest.approx(value, rel=1e-9), name


@pytest.mark.parametrize("entry", RESULT["held_out"], ids=[e["cell"] for e in RESULT["held_out"]])
def test_the_stored_profile_reproduces_each_held_out_figure(entry):
    cell = CELLS[entry["cell"]]
    assert list(cell.throughputs) == entry["throughputs"]
    (check,) = check_cells(PROFILE, [cell], SETUP, cell_profile=lambda p, c: testbed.at_agreement(p, c.agreement))
    assert check.sim_throughput == pytest.approx(entry["sim_throughput"], abs=0.1)
    assert check.throughput_ok is entry["throughput_ok"]
    if entry["sim_accept_length"] is not None:
        assert check.sim_accept_length == pytest.approx(entry["sim_accept_length"], abs=1e-4)
        assert check.accept_ok is entry["accept_ok"]


def test_the_result_s_summary_counts_its_cells():
    for part in ("held_out", "fit"):
        entries, summary = RESULT[part], RESULT[f"{part}_summary"]
        assert summary["cells"] == len(entries)
        assert summary["throughput_pass"] == sum(e["throughput_ok"] for e in entries)
        assert summary["accept_pass"] == sum(bool(e["accept_ok"]) for e in entries if e["accept_ok"] is not None)
    md = (ROOT / RESULT["results_md"]).read_text()
    assert "SIMULATED" in md and "one closed-loop run" in md
    held = RESULT["held_out_summary"]
    assert f"**{held['throughput_pass']} of {held['cells']} cells**" in md


def _synthetic_landscape(truth, setup: WaveSetup) -> dict:
    """Every cell of a small grid run by the simulator with ``truth`` (the accept length as simulated, no
    counters: compared uncounted)."""
    from tuning.simfit import MeasuredCell

    cells = []
    for n in (0, 1, 2, 3):
        for t in (0.0, 0.8):
            for c in (1, 4, 16, 64):
                probe = MeasuredCell(engine="x", num_draft_tokens=n, output_len=128, concurrency=c, temperature=t,
                                     throughputs=(1.0,), accept_lengths=(), excluded_waves=0, num_prompts=max(4, 2 * c))
                tput, accept = simulate_cell(truth, probe, setup)
                cell = _cell("mtp-off" if not n else f"a0.7-mtp{n}", n, 128, t, c, tput, accept=accept)
                cell["spec_counters"] = {}
                cells.append(cell)
    return _landscape(*cells)


def test_a_fit_on_a_simulated_landscape_recovers_the_constants_it_was_made_with():
    truth = PROFILE.replace(accept_p0=0.8, accept_temperature_slope=3.0, decode_overhead_ms=2.0,
                            eff_bandwidth=0.6, draft_overhead_ms=0.8)
    setup = WaveSetup(input_len=512, memory_fraction=0.5, max_batch_size=256, session_len=1088, max_prefill_tokens=8192)
    cells = landscape_cells([_synthetic_landscape(truth, setup)], testbed.TESTBED_SPLIT)
    fit_cells = [c for c in cells if not c.held_out]
    start = PROFILE.replace(accept_p0=0.6, accept_temperature_slope=1.0, decode_overhead_ms=4.0, eff_bandwidth=0.9,
                            draft_overhead_ms=2.0)
    bounds = {k: testbed.STEP_BOUNDS[k] for k in ("decode_overhead_ms", "eff_bandwidth", "draft_overhead_ms")}
    acceptance, steps, errors = testbed.fit(start, fit_cells, setup, step_bounds=bounds, min_rel_step=0.01,
                                            progress=lambda m: None)
    assert acceptance[0.7]["accept_p0"] == pytest.approx(0.8, abs=0.04)
    assert acceptance[0.7]["accept_temperature_slope"] == pytest.approx(3.0, abs=0.4)
    assert steps["decode_overhead_ms"] == pytest.approx(2.0, rel=0.1)
    assert steps["eff_bandwidth"] == pytest.approx(0.6, rel=0.15)
    assert steps["draft_overhead_ms"] == pytest.approx(0.8, abs=0.25)
    assert errors["throughput_log_rms"] < 0.05
    fitted = start.replace(**steps, **acceptance[0.7])
    checks = check_cells(fitted, [c for c in cells if c.held_out], setup)
    # a held-out cell of 4-8 requests draws its accepted drafts anew when p0 moves by 0.02: allow that noise
    assert statistics.median(abs(ch.throughput_error) for ch in checks) <= THROUGHPUT_TOLERANCE / 2
    assert all(abs(ch.accept_error) <= ACCEPT_TOLERANCE for ch in checks if ch.accept_error is not None)


def test_a_profile_with_two_agreement_levels_keeps_the_second_apart():
    data = testbed.build_profile(RESULT["fitted"], {0.7: {"accept_p0": 0.67, "accept_temperature_slope": 2.1},
                                                    0.9: {"accept_p0": 0.88, "accept_temperature_slope": 2.5}},
                                 "notes", 0.7)
    assert data["acceptance"]["accept_p0"] == 0.67 and data["other_agreements"] == {
        "0.9": {"accept_p0": 0.88, "accept_temperature_slope": 2.5}}
    from orchestrator.sim.model import Profile

    profile = Profile.from_dict(copy.deepcopy(data))
    assert testbed.at_agreement(profile, 0.9).accept_p0 == 0.88
    assert testbed.at_agreement(profile, 0.7) is profile and testbed.at_agreement(profile, None) is profile


def test_the_structure_is_chosen_on_fit_errors_alone_and_an_extra_constant_must_pay_for_itself():
    assert testbed.choose_structure({"additive": 0.20, "overlap": 0.15}, 48)[0] == "overlap"
    # the overlap structure nests the additive one: a fit no better by more than its extra constant buys keeps it
    assert testbed.choose_structure({"additive": 0.182, "overlap": 0.180}, 48)[0] == "additive"
    assert testbed.choose_structure({"additive": 0.182, "overlap": 0.182}, 48)[0] == "additive"
    name, scores = testbed.choose_structure({"additive": 0.182, "overlap": 0.17}, 48)
    assert scores["overlap"] < scores["additive"] and name == "overlap"
    with pytest.raises(SimFitError, match="known"):
        testbed.choose_structure({"max": 0.1}, 48)
    with pytest.raises(SimFitError, match="log-RMS > 0"):
        testbed.choose_structure({"additive": 0.0}, 48)


def test_the_stored_result_chose_what_its_fit_errors_choose_and_the_profile_holds_that_structure():
    structures = RESULT["structures"]
    assert set(structures) == set(testbed.STRUCTURES)
    chosen, scores = testbed.choose_structure({k: v["fit_log_rms"] for k, v in structures.items()},
                                              RESULT["fit_cells"])
    assert RESULT["chosen_structure"] == chosen
    assert {k: v["criterion"] for k, v in structures.items()} == pytest.approx(scores, abs=1e-3)
    assert RESULT["fitted"] == structures[chosen]["fitted"]
    assert RESULT["held_out_summary"] == structures[chosen]["held_out_summary"]
    assert PROFILE.host_overlap == structures[chosen]["fitted"].get("host_overlap", 0.0)
    assert PROFILE.sampling_overhead_ms == structures[chosen]["fitted"].get("sampling_overhead_ms", 0.0)
    assert all(structures[k]["fit_log_rms"] >= structures["overlap+sampling"]["fit_log_rms"] for k in structures)
    assert structures["additive"]["fitted"].get("host_overlap", 0.0) == 0.0
    md = (ROOT / RESULT["results_md"]).read_text()
    assert f"**{chosen}** (chosen)" in md and "FIT log-RMS" in md


def test_a_fit_of_both_structures_to_an_overlapped_landscape_chooses_the_overlap_on_fit_cells():
    truth = PROFILE.replace(accept_p0=0.8, accept_temperature_slope=3.0, decode_overhead_ms=3.0,
                            eff_bandwidth=0.6, draft_overhead_ms=0.8, host_overlap=1.0)
    setup = WaveSetup(input_len=512, memory_fraction=0.5, max_batch_size=256, session_len=1088, max_prefill_tokens=8192)
    cells = landscape_cells([_synthetic_landscape(truth, setup)], testbed.TESTBED_SPLIT)
    fit_cells = [c for c in cells if not c.held_out]
    start = PROFILE.replace(decode_overhead_ms=4.0, eff_bandwidth=0.9, draft_overhead_ms=2.0, host_overlap=0.0)
    acceptance, _ = testbed.fit_acceptance_levels(start, fit_cells, progress=lambda m: None)
    names = ("decode_overhead_ms", "eff_bandwidth", "draft_overhead_ms")
    kw = {"min_rel_step": 0.02, "progress": lambda m: None}
    additive, additive_rms = testbed.fit_steps(start, fit_cells, setup, acceptance,
                                               step_bounds={k: testbed.STEP_BOUNDS[k] for k in names}, **kw)
    assert "host_overlap" not in additive
    overlap, overlap_rms = testbed.fit_steps(start.replace(host_overlap=testbed.OVERLAP_START), fit_cells, setup,
                                             acceptance, step_bounds={**{k: testbed.STEP_BOUNDS[k] for k in names},
                                                                      **testbed.OVERLAP_BOUNDS}, **kw)
    # with the host part near the GPU part the search trades overlap against bandwidth (0.66 and 0.975 here, for
    # 1.0 and 0.6 made): what the FIT cells must show is that the overlap fits them and the sum does not
    assert overlap["host_overlap"] > 0.5 and overlap_rms < 0.05 < additive_rms
    assert testbed.choose_structure({"additive": additive_rms, "overlap": overlap_rms}, len(fit_cells))[0] == "overlap"


def test_one_runs_noise_comes_from_warm_repeats_not_from_greedy_against_sampled():
    cells = [_cell("mtp-off", 0, 512, t, c, tput) for t, c, tput in
             [(0.0, 4, 1000.0), (0.8, 4, 800.0), (0.0, 64, 5000.0), (0.8, 64, 4000.0)]]
    land = _landscape(*cells)
    land["superseded"] = {"mtp-off|out512|T0|c4": [{"output_throughput": 1100.0}],   # warm repeat: used
                          "mtp-off|out512|T0|c64": [{"output_throughput": 5000.0 / 1.2}],  # warm repeat: used
                          "mtp-off|out128|T0|c4": [{"output_throughput": 10.0}]}  # a first pass: not a repeat prefix
    land["cells"]["mtp-off|out128|T0|c4"] = _cell("mtp-off", 0, 128, 0.0, 4, 500.0)
    noise = testbed.one_run_noise([land], landscape_cells([land], testbed.TESTBED_SPLIT))
    logs = [math.log(1000 / 1100), math.log(1.2)]
    assert noise["pairs"] == 2 and noise["df"] == 2
    assert noise["one_run_log_sigma"] == pytest.approx(math.sqrt(statistics.fmean(x * x for x in logs) / 2), abs=1e-4)
    assert noise["greedy_over_sampled"] == {"o512 c4": 1.25, "o512 c64": 1.25} and noise["greedy_faster"] == 2
    assert 0 < noise["exact_model_pass_share"] < 1
    assert "one_run_log_sigma" not in testbed.one_run_noise([_landscape(*cells)], [])  # no repeat: no noise claimed


def test_a_landscape_whose_sampled_steps_cost_more_chooses_the_sampling_term_on_fit_cells():
    """The sampling term is searched from the overlap fit (a point of its structure, term 0) and kept only if it
    fits the FIT cells better; on cells made with a sampling cost it finds it and wins the criterion, on cells
    made without one it stays the overlap fit."""
    setup = WaveSetup(input_len=512, memory_fraction=0.5, max_batch_size=256, session_len=1088, max_prefill_tokens=8192)
    names = ("decode_overhead_ms", "eff_bandwidth")
    kw = {"min_rel_step": 0.02, "progress": lambda m: None}
    overlap_bounds = {**{k: testbed.STEP_BOUNDS[k] for k in names}, **testbed.OVERLAP_BOUNDS}

    def fit(truth: Profile) -> tuple[dict, float, dict, float, int]:
        cells = landscape_cells([_synthetic_landscape(truth, setup)], testbed.TESTBED_SPLIT)
        fit_cells = [c for c in cells if not c.held_out]
        start = PROFILE.replace(decode_overhead_ms=4.0, eff_bandwidth=0.9, host_overlap=testbed.OVERLAP_START)
        acceptance, _ = testbed.fit_acceptance_levels(start, fit_cells, progress=lambda m: None)
        overlap, overlap_rms = testbed.fit_steps(start, fit_cells, setup, acceptance, step_bounds=overlap_bounds, **kw)
        sampling, sampling_rms = testbed.fit_sampling_structure(
            start, fit_cells, setup, acceptance, overlap, overlap_rms,
            step_bounds={**overlap_bounds, **testbed.SAMPLING_BOUNDS}, **kw)
        return overlap, overlap_rms, sampling, sampling_rms, len(fit_cells)

    base = PROFILE.replace(accept_p0=0.8, accept_temperature_slope=3.0, decode_overhead_ms=3.0, eff_bandwidth=0.6,
                           host_overlap=0.5)
    overlap, overlap_rms, sampling, sampling_rms, n = fit(base.replace(sampling_overhead_ms=1.5))
    assert sampling["sampling_overhead_ms"] > 0.75 and sampling_rms < overlap_rms
    structures = {"overlap": overlap_bounds, "overlap+sampling": {**overlap_bounds, **testbed.SAMPLING_BOUNDS}}
    assert testbed.choose_structure({"overlap": overlap_rms, "overlap+sampling": sampling_rms}, n,
                                    structures)[0] == "overlap+sampling"
    overlap, overlap_rms, sampling, sampling_rms, n = fit(base)
    assert sampling["sampling_overhead_ms"] < 0.2
    assert testbed.choose_structure({"overlap": overlap_rms, "overlap+sampling": max(sampling_rms, 1e-6)}, n,
                                    structures)[0] == "overlap"
