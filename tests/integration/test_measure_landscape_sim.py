"""``measure_landscape.py --sim``: a dry run of the MoE testbed's landscape on simulated engines (real
processes behind real HTTP). Each cell keeps the engine's counter deltas beside its accept length, and a
folder that holds another run's cells reports only this run's as done."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.gpu import measure_landscape as landscape  # noqa: E402

ARGS = ["--sim", "--agreements", "0.7", "--draft-tokens", "2", "--concurrency", "4", "--temperatures", "0",
        "--output-len", "16", "--input-len", "32", "--waves", "1"]


def test_cells_keep_the_counter_deltas_and_the_summary_counts_this_runs_cells(tmp_path, capsys):
    out = tmp_path / "land"
    assert landscape.main([*ARGS, "--out", str(out)]) == 0
    cells = json.loads((out / "landscape.json").read_text())["cells"]
    assert set(cells) == {"mtp-off|out16|T0|c4", "a0.7-mtp2|out16|T0|c4"}
    assert cells["a0.7-mtp2|out16|T0|c4"]["spec_counters"]["num_drafts"] > 0 and \
        cells["a0.7-mtp2|out16|T0|c4"]["accept_length"] > 1
    assert cells["mtp-off|out16|T0|c4"]["spec_counters"]["num_drafts"] == 0
    capsys.readouterr()
    assert landscape.main([*ARGS, "--out", str(out), "--concurrency", "2"]) == 0  # same folder, other cells
    assert "2 of 2 cells in" in capsys.readouterr().out
    assert len(json.loads((out / "landscape.json").read_text())["cells"]) == 4
