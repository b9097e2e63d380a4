"""The test-checkpoint profile against its committed held-out check (issue #18 item 5): the stored profile
holds the constants the fit result claims, and still produces every simulated held-out figure of
``docs/analyses/sim_fit/sim_fit_test_ckpt_2026-12-01.json``, so a later profile edit that moves the fit is
caught here (and the result must be regenerated with ``docs/analyses/sim_fit/sim_fit_test_ckpt.py``)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.sim.model import load_profile
from tuning.simfit import (
    ACCEPT_TOLERANCE,
    THROUGHPUT_TOLERANCE,
    SimFitError,
    WaveSetup,
    coordinate_search,
    is_held_out,
    measured_cells,
    simulate_cell,
)

ROOT = Path(__file__).resolve().parents[2]
RESULT = json.loads((ROOT / "docs/analyses/sim_fit/sim_fit_test_ckpt_2026-12-01.json").read_text())
MEASUREMENT = json.loads((ROOT / RESULT["measurement"]).read_text())
PROFILE = load_profile(RESULT["profile"])
SETUP = WaveSetup(**RESULT["setup"])
CELLS = {c.name: c for c in measured_cells(MEASUREMENT["rows"], MEASUREMENT["engines"])}


def test_the_stored_profile_holds_the_fitted_constants_the_result_claims():
    for name, value in RESULT["fitted"].items():
        assert getattr(PROFILE, name) == pytest.approx(value, rel=1e-9), name
    for name, value in RESULT["held"].items():
        assert getattr(PROFILE, name) == pytest.approx(value, rel=1e-9), name
    assert RESULT["simulated"] is True and PROFILE.calibrated is False
    assert "SIMULATED" in PROFILE.notes and RESULT["results_md"] in PROFILE.notes


def test_the_split_is_the_stated_rule_and_covers_every_measured_cell():
    held = {e["cell"] for e in RESULT["held_out"]}
    fit = {e["cell"] for e in RESULT["fit"]}
    assert held | fit == set(CELLS) and not held & fit
    for name, cell in CELLS.items():
        assert (name in held) == is_held_out(cell.num_draft_tokens, cell.concurrency, cell.temperature)
    assert {CELLS[n].concurrency for n in held} >= {64} and any(CELLS[n].temperature > 0 for n in held)


@pytest.mark.parametrize("entry", RESULT["held_out"], ids=[e["cell"] for e in RESULT["held_out"]])
def test_the_stored_profile_reproduces_each_held_out_figure_and_verdict(entry):
    cell = CELLS[entry["cell"]]
    assert list(cell.throughputs) == entry["throughputs"]  # the measured side is the committed one
    throughput, accept = simulate_cell(PROFILE, cell, SETUP, seed=RESULT["seed"])
    assert throughput == pytest.approx(entry["sim_throughput"], abs=0.1)
    assert abs(throughput / cell.throughput - 1) <= THROUGHPUT_TOLERANCE if entry["throughput_ok"] else \
        abs(throughput / cell.throughput - 1) > THROUGHPUT_TOLERANCE
    if entry["sim_accept_length"] is None:
        assert accept is None
    else:
        assert accept == pytest.approx(entry["sim_accept_length"], abs=1e-4)
        assert (abs(accept - cell.accept_length) <= ACCEPT_TOLERANCE) == entry["accept_ok"]


def test_the_summary_counts_the_verdicts_of_its_cells():
    held, summary = RESULT["held_out"], RESULT["held_out_summary"]
    assert summary["cells"] == len(held)
    assert summary["throughput_pass"] == sum(e["throughput_ok"] for e in held)
    assert summary["accept_pass"] == sum(bool(e["accept_ok"]) for e in held)


def test_waves_with_a_failed_request_are_left_out_and_a_cell_without_waves_is_dropped():
    engines = {"off": {"backend": "pytorch", "num_draft_tokens": 0}}
    row = {"engine": "off", "output_len": 128, "concurrency": 8, "temperature": 0.0, "accept_length": None}
    cells = measured_cells([{**row, "round": 0, "output_throughput": 100.0, "failed": 0},
                            {**row, "round": 1, "output_throughput": 50.0, "failed": 1},
                            {**row, "concurrency": 64, "round": 0, "output_throughput": 9.0, "failed": 1}], engines)
    assert [(c.concurrency, c.throughputs, c.excluded_waves) for c in cells] == [(8, (100.0,), 1)]
    assert cells[0].throughput_half_spread is None  # one round: no spread known
    with pytest.raises(SimFitError, match="no wave"):
        measured_cells([{**row, "round": 0, "output_throughput": 1.0, "failed": 2}], engines)


def test_coordinate_search_finds_a_bounded_minimum():
    point, value = coordinate_search(lambda p: (p["a"] - 0.3) ** 2 + (p["b"] - 7.0) ** 2,
                                     {"a": 0.9, "b": 1.0}, {"a": (0.0, 1.0), "b": (0.0, 5.0)})
    assert point["a"] == pytest.approx(0.3, abs=0.01) and point["b"] == 5.0  # b's optimum lies outside: its bound
    assert value == pytest.approx(4.0, abs=1e-3)


def test_the_published_profile_takes_its_temperature_slope_from_this_fit_and_says_so():
    published = load_profile(RESULT["published_temperature_shape"]["profile"])
    assert published.accept_temperature_slope == PROFILE.accept_temperature_slope == RESULT["fitted"]["accept_temperature_slope"]
    assert "sim_fit_test_ckpt_2026-12-01.md" in published.notes and RESULT["published_temperature_shape"]["t0_unchanged"]


def test_a_cell_is_judged_by_the_interval_of_its_mean_which_narrows_with_rounds():
    """The ±10 % bar against the 95 % interval of the measured mean: pass when every mean the interval
    allows is within ±10 % of the simulated figure, fail when none is, undecided in between. Two rounds 1000
    and 1200 (1100 ± 12.706 x 100): a simulated 1300 is undecided; eight rounds of the same spread (1100 ±
    89.4, so 1010.6-1189.4) lie below 1350 / 1.1 = 1227.3: a simulated 1350 is a firm fail; within 1000-1222.2
    (1100 / 1.1 to 1100 / 0.9): a simulated 1100 is a firm pass."""
    from tuning.simfit import CellCheck, MeasuredCell

    def check(throughputs, sim):
        cell = MeasuredCell(engine="off", num_draft_tokens=0, output_len=128, concurrency=64, temperature=0.0,
                            throughputs=tuple(throughputs), accept_lengths=(), excluded_waves=0)
        return CellCheck(cell, sim_throughput=sim, sim_accept_length=None)

    two = check([1000.0, 1200.0], 1300.0)
    low, high = two.cell.throughput_ci
    assert (low + high) / 2 == pytest.approx(1100.0) and high - 1100.0 == pytest.approx(12.706 * 100.0, rel=1e-3)
    assert two.throughput_verdict == "undecided" and not two.throughput_ok
    assert check([1000.0, 1200.0] * 4, 1350.0).throughput_verdict == "fail"
    assert check([1000.0, 1200.0] * 4, 1100.0).throughput_verdict == "pass"
    assert check([1000.0, 1200.0] * 4, 1200.0).throughput_verdict == "undecided"  # bar 1090.9-1333.3: 1010.6 lies below it
    assert check([1000.0], 1000.0).throughput_verdict is None and check([1000.0], 1000.0).cell.throughput_ci is None
    assert two.to_dict()["measured_ci"] == [round(low, 1), round(high, 1)]


def test_a_rounds_waves_make_one_figure_their_mean():
    """``measure_turbomind.py --waves``: the waves of one engine start are one round, not several."""
    engines = {"mtp2": {"backend": "pytorch", "num_draft_tokens": 2}}
    row = {"engine": "mtp2", "output_len": 128, "concurrency": 8, "temperature": 0.8, "failed": 0}
    (cell,) = measured_cells([{**row, "round": 0, "wave": 0, "output_throughput": 100.0, "accept_length": 1.8},
                              {**row, "round": 0, "wave": 1, "output_throughput": 200.0, "accept_length": 2.0},
                              {**row, "round": 0, "wave": 2, "output_throughput": 5.0, "accept_length": 9.0, "failed": 1},
                              {**row, "round": 1, "wave": 0, "output_throughput": 120.0, "accept_length": 1.7}], engines)
    assert cell.throughputs == (150.0, 120.0) and cell.accept_lengths == pytest.approx((1.9, 1.7))
    assert cell.excluded_waves == 1
    # Two runs' round 0 are two rounds (a pooled measure_turbomind result tags its rows with their run).
    (pooled,) = measured_cells([{**row, "run": 0, "round": 0, "output_throughput": 100.0, "accept_length": 1.8},
                                {**row, "run": 1, "round": 0, "output_throughput": 200.0, "accept_length": 2.0}], engines)
    assert pooled.throughputs == (100.0, 200.0)


def test_a_cell_whose_counters_saw_few_outputs_is_compared_as_those_counters_count():
    """Rows with the counters' deltas: the cell keeps the outputs per request they saw (mean over its waves,
    failed waves left out), and the simulated accept length is turned into what the same counting reports
    (above the model's tokens per step, by the length-biased last step); rows without them compare as before."""
    from orchestrator.sim.model import accept_distribution, expected_accept_length
    from tuning.bench.counters import counted_accept_length
    from tuning.simfit import as_counted, check_cells, fit_acceptance

    engines = {"mtp4": {"backend": "pytorch", "num_draft_tokens": 4}}
    row = {"engine": "mtp4", "output_len": 128, "concurrency": 64, "temperature": 0.8, "failed": 0, "completed": 64,
           "output_throughput": 5000.0, "accept_length": 2.4}
    (cell,) = measured_cells([{**row, "round": 0, "wave": 0, "spec_counters": {"num_drafts": 128.0}},
                              {**row, "round": 0, "wave": 1, "spec_counters": {"num_drafts": 192.0}},
                              {**row, "round": 1, "wave": 0, "spec_counters": {"num_drafts": 640.0}, "failed": 1}],
                             engines)
    assert cell.counted_outputs == pytest.approx(2.4)  # harmonic mean of 2 and 3 outputs per request
    (plain,) = measured_cells([{**row, "round": 0}], engines)
    assert plain.counted_outputs is None and as_counted(PROFILE, plain, 2.0) == 2.0
    counted = as_counted(PROFILE, cell, 2.0)
    assert counted == pytest.approx(counted_accept_length(2.0, accept_distribution(PROFILE, 4, 0.8, 127), 2.4))
    assert counted > 2.1
    (check,) = check_cells(PROFILE, [cell], SETUP)
    (raw,) = check_cells(PROFILE, [plain], SETUP)
    assert check.sim_accept_length > raw.sim_accept_length and check.sim_throughput == raw.sim_throughput
    # fitting against counted figures recovers a profile whose counted figure meets them
    point, rms = fit_acceptance(PROFILE, [cell])
    fitted = PROFILE.replace(**point)
    tokens_per_step = expected_accept_length(fitted, 4, 0.8, 128, 1.0)
    assert rms < 0.01 and as_counted(fitted, cell, tokens_per_step) == pytest.approx(2.4, abs=0.01)
    assert tokens_per_step < 2.4  # the engine's own figure lies below what its counters report
