"""The mixed-payoff benchmark's pure parts: each class's share of a drive's goodput, the table against
the best single config round by round, and the report's labels for real engines."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))

import mixed_payoff as payoff  # noqa: E402


def _drive(app, rnd, classes, kept=True):
    total = sum(classes)
    return {"mix": "stated", "round": rnd, "app": app, "kept_schedule": kept, "classes": classes,
            "overall": {"goodput": total, "throughput": total}, "phases": [{"label": "steady", "goodput": total, "throughput": total}]}


def test_class_goodputs_split_the_drives_goodput():
    from tuning.drive import MLPERF_SERVER_SLO, DriveRecord, overall_figures
    from tuning.traffic import LoadProfile

    profile = LoadProfile.model_validate({"phases": [{"seconds": 10, "concurrency": 4}]})
    records = [DriveRecord(index=i, phase=0, class_index=i % 3, max_tokens=64, temperature=0.0, prompt_len=32, started_at=i * 0.5,
                           first_token_at=i * 0.5 + 0.1, finished_at=i * 0.5 + 1.0 + (i % 2), output_tokens=64, ok=i != 4)
               for i in range(12)]
    parts = payoff.class_goodputs(records, profile, MLPERF_SERVER_SLO, 3)
    assert len(parts) == 3 and all(p > 0 for p in parts)
    assert sum(parts) == pytest.approx(overall_figures(records, profile, MLPERF_SERVER_SLO).goodput)


def test_the_table_is_reported_against_the_best_single_round_by_round():
    drives = [_drive("table", 0, [10.0, 30.0]), _drive("single-a", 0, [12.0, 20.0]), _drive("single-b", 0, [5.0, 28.0]),
              _drive("table", 1, [11.0, 27.0]), _drive("single-a", 1, [10.0, 22.0]), _drive("single-b", 1, [6.0, 30.0])]
    s = payoff.summarize(drives, ["table", "single-a", "single-b"])["stated"]
    assert s["best_single"] == "single-b"
    assert s["ratio table / best single"]["values"] == pytest.approx([40 / 33, 38 / 36], abs=1e-4)
    md = payoff.render_markdown({"summary": {"stated": s}, "slo": {"ttft_s": 2.0, "tpot_s": 0.08}, "simulated": False})
    assert "table / best single" in md and "(measured)" in md and "simulated time" not in md
