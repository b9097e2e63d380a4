"""The MoE testbed's landscape apart from measuring it (:mod:`tuning.landscape`, what
``benchmarks/gpu/measure_landscape.py`` runs and reports): which engines and cells a run plans, and what the
report says of each cell's accept length against the builder's prediction."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tuning import landscape


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


def test_a_landscape_cell_records_how_many_start_tokens_its_prediction_averaged(tmp_path: Path) -> None:
    (tmp_path / "acceptance.json").write_text(json.dumps({"start_tokens": 32759, "predicted_accept_length": {}}))
    assert landscape.prediction_start_tokens(tmp_path) == 32759
    (tmp_path / "acceptance.json").write_text(json.dumps({"predicted_accept_length": {}}))  # built before it was kept
    assert landscape.prediction_start_tokens(tmp_path) is None
    assert landscape.prediction_start_tokens(None) is None and landscape.prediction_start_tokens(tmp_path / "x") is None
