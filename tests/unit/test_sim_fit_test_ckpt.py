"""The test-checkpoint profile against its committed held-out check (issue #18 item 5): the stored profile
holds the constants the fit result claims, and still produces every simulated held-out figure of
``benchmarks/results/sim_fit_test_ckpt_2026-12-01.json``, so a later profile edit that moves the fit is
caught here (and the result must be regenerated with ``benchmarks/sim_fit_test_ckpt.py``)."""
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
RESULT = json.loads((ROOT / "benchmarks/results/sim_fit_test_ckpt_2026-12-01.json").read_text())
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
    """Two rounds 1000 and 1200: the 95 % t-interval of the mean (1100 ± 12.71 x 100 / sqrt 2 x sqrt 2 =
    ± 1270.6) is far wider than ±10 %, so a simulated 1300 (18 % off) is no firm miss; eight rounds of the
    same spread place the mean within ±10 % and the same figure is a firm miss."""
    from tuning.simfit import CellCheck, MeasuredCell

    def cell(throughputs):
        return MeasuredCell(engine="off", num_draft_tokens=0, output_len=128, concurrency=64, temperature=0.0,
                            throughputs=tuple(throughputs), accept_lengths=(), excluded_waves=0)

    two = CellCheck(cell([1000.0, 1200.0]), sim_throughput=1300.0, sim_accept_length=None)
    low, high = two.cell.throughput_ci
    assert (low + high) / 2 == pytest.approx(1100.0) and high - 1100.0 == pytest.approx(12.706 * 100.0, rel=1e-3)
    assert two.ci_exceeds_tolerance and two.inside_ci and not two.throughput_ok
    eight = CellCheck(cell([1000.0, 1200.0] * 4), sim_throughput=1300.0, sim_accept_length=None)
    assert not eight.ci_exceeds_tolerance and eight.inside_ci is False and not eight.throughput_ok
    one = CellCheck(cell([1000.0]), sim_throughput=1000.0, sim_accept_length=None)
    assert one.cell.throughput_ci is None and one.inside_ci is None and not one.ci_exceeds_tolerance
    assert two.to_dict()["measured_ci"] == [round(low, 1), round(high, 1)]


def test_runs_of_the_same_engines_pool_round_after_round_and_their_accept_lengths_are_compared():
    """``sim_fit_test_ckpt.py --measurement A B``: B's rounds follow A's in each cell, a run with other wave
    flags is refused, and how far a cell's accept length moved between the runs is reported."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sim_fit_script", ROOT / "benchmarks" / "sim_fit_test_ckpt.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)

    def run(throughputs, accepts, memory_fraction=0.1):
        engine = {"backend": "pytorch", "num_draft_tokens": 2, "memory_fraction": memory_fraction,
                  "max_batch_size": 64, "session_len": 4096, "max_prefill_tokens": 8192}
        rows = [{"round": i, "engine": "mtp2", "output_len": 128, "concurrency": 64, "temperature": 0.0,
                 "output_throughput": t, "accept_length": a, "failed": 0} for i, (t, a) in enumerate(zip(throughputs, accepts))]
        return {"engines": {"mtp2": engine, "tm": {"backend": "turbomind"}}, "workload": {"input_len": 512}, "rows": rows}

    a, b = run([100.0, 110.0], [2.0, 2.1]), run([90.0], [2.5])
    setup, rows, engines = script.pooled([a, b])
    assert setup.memory_fraction == 0.1 and set(engines) == {"mtp2"}
    (cell,) = measured_cells(rows, engines)
    assert cell.throughputs == (100.0, 110.0, 90.0) and [r["round"] for r in rows] == [0, 1, 2]
    between = script.accept_between_runs([a, b])
    assert between["by_cell"] == {"mtp2 o128 c64 T0": pytest.approx(0.45)} and between["beyond_tolerance"] == ["mtp2 o128 c64 T0"]
    assert script.accept_between_runs([a]) is None
    with pytest.raises(SystemExit, match="wave setup"):
        script.pooled([a, run([1.0], [2.0], memory_fraction=0.5)])


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
