"""The pure parts of the GPU measurement scripts (their GPU runs are recorded under benchmarks/results):
the order conditions are measured in, how rounds are paired and pooled, which engines a landscape runs
and what it reports."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.gpu import measure_landscape as landscape  # noqa: E402
from benchmarks.gpu import measure_suspects as suspects  # noqa: E402
from benchmarks.gpu import measure_turbomind as turbomind  # noqa: E402


def _args(**kw):
    return argparse.Namespace(
        **{"agreements": [0.5, 0.9], "draft_tokens": [1, 3], "concurrency": [1, 64], "temperatures": [0.0, 0.8],
           "output_len": [128], **kw})


def test_the_landscape_runs_mtp_off_once_then_every_agreement_and_draft_count():
    names = [e["name"] for e in landscape.engines_planned(_args())]
    assert names == ["mtp-off", "a0.5-mtp1", "a0.5-mtp3", "a0.9-mtp1", "a0.9-mtp3"]
    cells = landscape.cells_of(_args())
    assert len(cells) == 4 and len({landscape.cell_key(n, *c) for n in names for c in cells}) == 20


def test_the_landscape_report_puts_each_config_against_mtp_off_with_predicted_acceptance():
    def cell(engine, n, ag, c, tput, acc=None, pred=None):
        return {"engine": engine, "agreement": ag, "draft_tokens": n, "output_len": 128, "temperature": 0.0,
                "concurrency": c, "output_throughput": tput, "accept_length": acc, "predicted_accept_length": pred,
                "failed": 0}

    state = {"simulated": False, "preset": landscape.PRESET, "commands": ["python x"], "host": {}, "sharpness": 8.0,
             "input_len": 512, "waves": 2, "starts_s": {},
             "cells": {"a": cell("mtp-off", 0, None, 1, 100.0), "b": cell("a0.7-mtp3", 3, 0.7, 1, 150.0, 3.4, 3.45)}}
    page = landscape.render(state)
    assert "## agreement 0.7, output 128, T 0" in page
    assert "| 1 | 100 | 1.50x (3.40 / 3.45) |" in page
    assert "SIMULATED" not in page
    assert "1 of 1 cells as predicted" in page and "as LMDeploy's counters" not in page  # no deltas, no counted figure


def test_the_landscape_report_counts_the_prediction_as_the_engine_counters_do():
    """Under load LMDeploy's counters see few of a request's steps, always its last, so a cell's measured accept
    length is compared with the builder's prediction counted the same way (more outputs: closer to the prediction)."""
    def cell(c, acc, outputs_per_request):
        return {"engine": "a0.7-mtp3", "agreement": 0.7, "draft_tokens": 3, "output_len": 128, "temperature": 0.0,
                "concurrency": c, "output_throughput": 100.0, "accept_length": acc, "predicted_accept_length": 2.41,
                "completed": 8, "failed": 0, "spec_counters": {"num_drafts": 8.0 * outputs_per_request}}

    loaded, light = cell(256, 3.04, 1.2), cell(1, 2.43, 40.0)
    assert landscape.predicted_as_counted(light) == pytest.approx(2.41, abs=0.03)
    assert 2.8 < landscape.predicted_as_counted(loaded) < 3.1  # the last step, length-biased, dominates
    assert landscape.predicted_as_counted(loaded | {"spec_counters": None}) is None
    line = landscape.accept_agreement([loaded, light])
    assert "1 of 2 cells as predicted (worst 0.63)" in line and "2 of 2 as LMDeploy's counters" in line
    state = {"simulated": False, "preset": landscape.PRESET, "commands": [], "host": {}, "sharpness": 8.0,
             "input_len": 512, "waves": 2, "starts_s": {}, "cells": {"a": loaded, "b": light}}
    assert f"(3.04 / 2.41 → {landscape.predicted_as_counted(loaded):.2f})" in landscape.render(state)


def _wave(rnd, tput, failed=0, reasons=None, engine="turbomind", run=None):
    row = {"round": rnd, "engine": engine, "output_len": 128, "concurrency": 256, "temperature": 0.0,
           "output_throughput": tput, "completed": 256 - failed, "failed": failed, "failure_reasons": reasons}
    return row if run is None else row | {"run": run}


def test_a_wave_that_lost_only_empty_text_counts_scaled_and_a_clean_retry_replaces_it():
    empty = {turbomind.EMPTY_TEXT: 1}
    rows = [_wave(0, 255.0, 1, empty), _wave(1, 100.0, 1, empty), _wave(1, 120.0),  # round 1 retried clean
            _wave(2, 300.0, 1, {"timeout": 1}), _wave(3, 200.0, 1, None)]
    counted = {r["round"]: r for r in turbomind.counted_rows(rows)}
    assert counted[0]["output_throughput"] == pytest.approx(256.0) and counted[0]["admitted"] == "empty text"
    assert counted[1]["output_throughput"] == 120.0 and not counted[1].get("admitted")
    assert 2 not in counted and 3 not in counted  # a timeout is a loss; an unrecorded one only when asked
    assert turbomind.counted_rows(rows, admit_unrecorded=True)[-1]["output_throughput"] == pytest.approx(200.0 * 256 / 255)


def test_pooled_runs_give_a_cell_every_runs_rounds():
    def run(rows, conc, batch):
        return {"command": "c", "rounds": 2, "order": [["turbomind"]], "starts": [], "rows": rows, "ckpt": "/c",
                "engines": {"turbomind": {"backend": "turbomind", "max_batch_size": batch}},
                "workload": {"concurrency": conc, "input_len": 512, "output_len": [128]}, "notes": []}
    a = run([_wave(0, 100.0), _wave(1, 110.0, 1, None)], [8, 256], 256)
    b = run([_wave(0, 90.0), _wave(1, 95.0, 1, {turbomind.EMPTY_TEXT: 1})], 256, 128)
    cell = turbomind.pooled([a, b])["summary"]["turbomind@o128@c256@T0"]
    assert cell["output_throughput"] == [100.0, 90.0, 95.4] and cell["admitted"] == [None, None, "empty text"]
    both = turbomind.pooled([a, b], admit_unrecorded=True)
    assert both["summary"]["turbomind@o128@c256@T0"]["rounds"] == 4 and both["workload"]["concurrency"] == [8, 256]
    assert both["notes"] == ["engine turbomind differs in run 2: max_batch_size 256 -> 128"]
    md = turbomind.render_markdown(both)
    assert "Run 2: Command" in md and "95*" in md and "110†" in md and "without a recorded reason" in md
    assert "engine turbomind differs" in md


def test_a_round_is_the_mean_of_its_waves_and_a_short_or_admitted_round_is_marked():
    """``--waves``: one figure per round, the mean of its waves; a round that lost a wave in every attempt
    is the mean of the others and carries ‡; a round with an admitted (empty-text) wave carries *."""
    def wave(rnd, w, tput, **kw):
        return {"round": rnd, "wave": w, "engine": "turbomind", "output_len": 128, "concurrency": 8,
                "temperature": 0.0, "output_throughput": tput, "completed": 8, "failed": 0, "failure_reasons": None} | kw

    rows = [wave(0, 0, 100.0), wave(0, 1, 300.0),
            wave(1, 0, 100.0), wave(1, 1, 5.0, failed=3, completed=5, failure_reasons={"timeout": 3}),
            wave(2, 0, 70.0, failed=1, completed=7, failure_reasons={turbomind.EMPTY_TEXT: 1}), wave(2, 1, 120.0)]
    cell = turbomind.summarize(rows)["turbomind@o128@c8@T0"]
    assert cell["output_throughput"] == [200.0, 100.0, 100.0] and cell["waves"] == [2, 1, 2]
    assert cell["admitted"] == [None, None, "empty text"]
    res = {"command": "c", "rounds": 3, "order": [["turbomind"]], "starts": [], "rows": rows, "ckpt": "/c", "notes": [],
           "engines": {"turbomind": {"backend": "turbomind"}}, "summary": turbomind.summarize(rows),
           "workload": {"concurrency": [8], "input_len": 512, "output_len": [128], "waves": 2}}
    md = turbomind.render_markdown(res)
    assert "| 200, 100‡, 100* |" in md and "fewer measured waves" in md and "2 measured waves per cell" in md


def test_a_landscape_cell_records_how_many_start_tokens_its_prediction_averaged(tmp_path: Path) -> None:
    (tmp_path / "acceptance.json").write_text(json.dumps({"start_tokens": 32759, "predicted_accept_length": {}}))
    assert landscape.prediction_start_tokens(tmp_path) == 32759
    (tmp_path / "acceptance.json").write_text(json.dumps({"predicted_accept_length": {}}))  # built before it was kept
    assert landscape.prediction_start_tokens(tmp_path) is None
    assert landscape.prediction_start_tokens(None) is None and landscape.prediction_start_tokens(tmp_path / "x") is None
