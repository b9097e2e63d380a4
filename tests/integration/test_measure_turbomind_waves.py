"""``measure_turbomind.py --waves``: several measured waves per cell per engine start, each with its own
prompts, and a round's figure the mean of its waves. Run as a dry run on simulated engines (the script's
``--sim``: real processes behind real HTTP, the simulator's figures)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def measure(*args: str) -> subprocess.CompletedProcess[str]:
    """The script run as a user runs it, from the repository root."""
    return subprocess.run([sys.executable, "-m", "benchmarks.gpu.measure_turbomind", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_waves_send_their_own_prompts_and_a_round_is_the_mean_of_its_waves(tmp_path):
    out = tmp_path / "tm"
    done = measure("--sim", "--out", str(out), "--engines", "pytorch-mtp-off,pytorch-mtp2", "--concurrency", "4",
                   "--output-len", "16", "--input-len", "32", "--temperatures", "0,0.8", "--rounds", "2", "--waves", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    res = json.loads((out / "turbomind_results.json").read_text())
    rows = res["rows"]
    assert res["workload"]["waves"] == 3
    for engine in ("pytorch-mtp-off", "pytorch-mtp2"):
        for rnd in (0, 1):
            waves = [r for r in rows if r["engine"] == engine and r["round"] == rnd and r["temperature"] == 0.8]
            assert sorted((r["wave"], r["prompt_seed"]) for r in waves) == [(0, 0), (1, 1), (2, 2)]  # as the bench ran them
    cell = res["summary"]["pytorch-mtp2@o16@c4@T0.8"]
    assert cell["rounds"] == 2 and cell["waves"] == [3, 3]
    for rnd, figure in enumerate(cell["output_throughput"]):
        waves = [r["output_throughput"] for r in rows
                 if r["engine"] == "pytorch-mtp2" and r["round"] == rnd and r["temperature"] == 0.8]
        assert figure == pytest.approx(sum(waves) / 3, abs=0.05)
    assert "3 measured waves per cell per round" in (out / "turbomind_results.md").read_text()
    # every wave keeps the engine's counter deltas: how many decode outputs they saw says how biased the
    # counted accept length is (tuning.bench.counters); MTP off counts no drafts
    for r in rows:
        drafts = (r["spec_counters"] or {}).get("num_drafts", 0.0)
        assert (drafts > 0) == (r["engine"] == "pytorch-mtp2"), r


def test_waves_must_be_positive(tmp_path):
    done = measure("--sim", "--out", str(tmp_path), "--waves", "0")
    assert done.returncode == 2 and "--waves 0" in done.stderr  # argparse's error exit
