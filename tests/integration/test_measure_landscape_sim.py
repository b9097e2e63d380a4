"""``measure_landscape.py --sim``: a dry run of the MoE testbed's landscape on simulated engines (real
processes behind real HTTP). Each cell keeps the engine's counter deltas beside its accept length, and a
folder that holds another run's cells reports only this run's as done."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tuning import landscape

ROOT = Path(__file__).resolve().parents[2]

ARGS = ["--sim", "--agreements", "0.7", "--draft-tokens", "2", "--concurrency", "4", "--temperatures", "0",
        "--output-len", "16", "--input-len", "32", "--waves", "1"]


def measure(*args: str) -> str:
    """The script run as a user runs it, from the repository root; its output (the test fails if it does)."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu.measure_landscape", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_cells_keep_the_counter_deltas_and_the_summary_counts_this_runs_cells(tmp_path):
    out = tmp_path / "land"
    measure(*ARGS, "--out", str(out))
    cells = json.loads((out / "landscape.json").read_text())["cells"]
    assert set(cells) == {"mtp-off|out16|T0|c4", "a0.7-mtp2|out16|T0|c4"}
    assert cells["a0.7-mtp2|out16|T0|c4"]["spec_counters"]["num_drafts"] > 0 and \
        cells["a0.7-mtp2|out16|T0|c4"]["accept_length"] > 1
    assert cells["mtp-off|out16|T0|c4"]["spec_counters"]["num_drafts"] == 0
    assert "2 of 2 cells in" in measure(*ARGS, "--out", str(out), "--concurrency", "2")  # same folder, other cells
    assert len(json.loads((out / "landscape.json").read_text())["cells"]) == 4


def test_redo_measures_older_cells_again_once_and_keeps_their_figures(tmp_path):
    """A cell measured before the per-concurrency warm-up is measured again when ``--redo`` names it; the old
    figure stays in the file, and running the same command again (a lease cut short) redoes nothing."""
    out = tmp_path / "land"
    measure(*ARGS, "--out", str(out))
    path = out / "landscape.json"
    state = json.loads(path.read_text())
    assert all(x["warmup"] == landscape.WARMUP for x in state["cells"].values())
    del state["cells"]["mtp-off|out16|T0|c4"]["warmup"]  # as the first lease's cells were
    state["cells"]["mtp-off|out16|T0|c4"]["output_throughput"] = 1.0
    path.write_text(json.dumps(state))
    redo = [*ARGS, "--out", str(out), "--redo", "mtp-off|"]
    measure(*redo)
    after = json.loads(path.read_text())
    assert after["superseded"]["mtp-off|out16|T0|c4"][0]["output_throughput"] == 1.0
    assert after["cells"]["mtp-off|out16|T0|c4"]["output_throughput"] > 1.0
    assert after["cells"]["a0.7-mtp2|out16|T0|c4"] == state["cells"]["a0.7-mtp2|out16|T0|c4"]  # not named: kept
    measure(*redo)
    assert json.loads(path.read_text()) == after  # nothing left to measure: the file is not even rewritten
    assert "Measured again after the per-concurrency warm-up" in landscape.render(after)
    pending = after | {"cells": {k: v for k, v in after["cells"].items() if k != "mtp-off|out16|T0|c4"}}
    assert "Measured again" not in landscape.render(pending)  # moved aside, its engine failed: not re-measured yet
