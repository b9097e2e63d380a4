"""The mixed-payoff benchmark's cap: each class of the mix credited with the best goodput any single
config gave it in the same round, and the table's ratios to it and to the best single config."""
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


def test_the_cap_takes_each_class_from_the_single_config_that_served_it_best():
    here = {d["app"]: d for d in (_drive("table", 0, [10.0, 30.0]), _drive("single-a", 0, [12.0, 20.0]),
                                  _drive("single-b", 0, [5.0, 28.0]), _drive("single-c", 0, [50.0, 50.0], kept=False))}
    assert payoff.composed_cap(here) == 40.0  # 12 from a, 28 from b; c fell behind and ranks nothing
    assert payoff.composed_cap({"table": here["table"]}) is None


def test_the_table_is_reported_against_the_cap_and_the_best_single_round_by_round():
    drives = [_drive("table", 0, [10.0, 30.0]), _drive("single-a", 0, [12.0, 20.0]), _drive("single-b", 0, [5.0, 28.0]),
              _drive("table", 1, [11.0, 27.0]), _drive("single-a", 1, [10.0, 22.0]), _drive("single-b", 1, [6.0, 30.0])]
    s = payoff.summarize(drives, ["table", "single-a", "single-b"])["stated"]
    assert s["best_single"] == "single-b"
    assert s["ratio table / cap"]["values"] == pytest.approx([40 / 40, 38 / 40])
    assert s["ratio table / best single"]["values"] == pytest.approx([40 / 33, 38 / 36], abs=1e-4)
    md = payoff.render_markdown({"summary": {"stated": s}, "slo": {"ttft_s": 2.0, "tpot_s": 0.08}, "simulated": False})
    assert "table / cap" in md and "(measured)" in md and "simulated time" not in md
