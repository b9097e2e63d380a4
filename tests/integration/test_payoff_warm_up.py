"""The payoff benchmark warms every app up before it measures anything: one unmeasured drive of the
stated mix per app, kept apart from the rounds' drives (a real Ray and Serve, simulated engines)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_every_app_is_driven_once_unmeasured_before_the_rounds(tmp_path):
    mix = tmp_path / "mix.yaml"
    mix.write_text("default_temperature: 0.7\nclasses:\n  - {max_tokens: 32, temperature: 0.0, share: 0.5}\n"
                   "  - {max_tokens: 32, temperature: 0.8, share: 0.5}\n")
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "mixed_payoff.py"), "--mix", str(mix),
                          "--warm-up", "--warm-up-s", "2", "--no-cap", "--apps", "table", "--rounds", "1", "--other-mixes", "",
                          "--profile-scale", "0.05", "--levels", "1,2,2", "--time-scale", "4", "--num-cpus", "2",
                          "--no-direct-ingress", "--out-dir", str(tmp_path / "out"), "--work-dir", str(tmp_path / "work"),
                          "--name", "warm"],
                         capture_output=True, text=True, timeout=400, cwd=ROOT, check=False,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "warm.json").read_text())
    assert [w["app"] for w in result["warm_up"]] == ["table"]
    assert result["warm_up"][0]["requests"] > 0 and result["warm_up"][0]["failed"] == 0
    assert [(d["mix"], d["round"], d["app"]) for d in result["drives"]] == [("stated", 0, "table")]
    assert "warm-up table:" in out.stderr + out.stdout
    burst = 2 * result["engines_per_app"]  # --levels' burst, per engine
    assert result["warm_up_plan"] == {"on": True, "seconds": 2.0, "in_flight": burst}
    report = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "mixed_payoff.py"), "--render",
                             str(tmp_path / "out" / "warm.json")], capture_output=True, text=True, timeout=60, cwd=ROOT,
                            check=True).stdout
    assert ("Warm-up, before anything was measured (one unmeasured 2-s drive of the stated mix per app at "
            f"{burst} in flight): table") in report


def test_a_warm_up_of_no_length_is_refused_before_anything_starts(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "mixed_payoff.py"), "--warm-up-s", "0",
                          "--out-dir", str(tmp_path)], capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert out.returncode == 2 and "--warm-up-s 0.0 must be a positive number of seconds" in out.stderr
    assert not list(tmp_path.iterdir())
