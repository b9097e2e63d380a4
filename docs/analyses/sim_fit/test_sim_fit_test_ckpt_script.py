"""``sim_fit_test_ckpt.py``'s own parts: runs pooled round after round and the write-up of its result (a study:
run from the repository root with ``python -m pytest docs/analyses/sim_fit``). The fit's package parts are
tested in ``tests/unit/test_sim_fit_test_ckpt.py``."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from docs.analyses.sim_fit import sim_fit_test_ckpt as script
from tuning.simfit import measured_cells

ROOT = Path(__file__).resolve().parents[3]
RESULT = json.loads((ROOT / "docs/analyses/sim_fit/sim_fit_test_ckpt_2026-12-01.json").read_text())


def test_runs_of_the_same_engines_pool_round_after_round_and_their_accept_lengths_are_compared():
    """``sim_fit_test_ckpt.py --measurement A B``: B's rounds follow A's in each cell, a run with other wave
    flags is refused, and how far a cell's accept length moved between the runs is reported."""

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
    assert cell.throughputs == (100.0, 110.0, 90.0) and [(r["run"], r["round"]) for r in rows] == [(0, 0), (0, 1), (1, 0)]
    between = script.accept_between_runs([a, b])
    assert between["by_cell"] == {"mtp2 o128 c64 T0": pytest.approx(0.45)} and between["beyond_tolerance"] == ["mtp2 o128 c64 T0"]
    assert script.accept_between_runs([a]) is None
    with pytest.raises(SystemExit, match="wave setup"):
        script.pooled([a, run([1.0], [2.0], memory_fraction=0.5)])
    # A run of more requests per wave than the concurrency (--num-prompts) measures other cells.
    setup, rows, engines = script.pooled([a, {**b, "workload": {**b["workload"], "num_prompts": 256}}])
    cells = measured_cells(rows, engines)
    assert [(c.name, c.requests, c.throughputs) for c in cells] == [
        ("mtp2 o128 c64 T0", 64, (100.0, 110.0)), ("mtp2 o128 c64 T0 n256", 256, (90.0,))]
    other = run([1.0], [2.0])
    other["engines"]["mtp2"] = {**other["engines"]["mtp2"], "num_draft_tokens": 3}
    with pytest.raises(SystemExit, match="different draft counts"):
        script.pooled([a, other])


def test_the_write_up_says_what_its_own_result_holds():
    """The markdown's run-specific sentences follow the result: runs pooled, waves per round, whether the fit
    was stored (and which fit the profile keeps otherwise), the verdicts by interval, the runs' disagreement."""
    pooled = json.loads((ROOT / "docs/analyses/sim_fit/sim_fit_test_ckpt_2026-12-02_pooled.json").read_text())
    md = script.render_md(pooled)
    assert "3 runs pooled" in md and "one wave each" in md
    assert "not stored in the profile, which keeps the fit of `sim_fit_test_ckpt_2026-12-01`" in md
    verdicts = pooled["held_out_summary"]["by_interval"]
    assert f"**{verdicts['pass']} pass**" in md and f"{verdicts['undecided']} undecided" in md
    assert f"in {len(pooled['accept_between_runs']['no_profile_within_both'])} the runs lie more than ±0.3 apart" in md
    waves = script.render_md({**pooled, "waves_per_round": [3, 3], "profile_written": True})
    assert "each the mean of its 3 waves" in waves and "of its own seed" in waves and "one wave each" not in waves
    assert "(stored in the profile)" in waves and "reproduces every simulated figure here" in waves
    steps = json.loads((ROOT / "docs/analyses/sim_fit/sim_fit_test_ckpt_2026-12-02_steps.json").read_text())
    md = script.render_md(steps)
    assert "Part of that rise is how LMDeploy counts" in md and "no cell kept the counters' deltas" in md
    assert "each the mean of its 2 waves" in md and "rounds per cell (`tuning.stats.rounds_for_half_width`)" in md
    older = script.render_md(RESULT)  # written before rounds and waves were recorded: counted from its cells
    assert "(1-2 rounds per cell, interleaved between the engines, one wave each;" in older
    assert "(stored in the profile)" in older
