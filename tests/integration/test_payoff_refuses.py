"""The payoff benchmark keeps every app resident at once: apps of real engines that cannot all be
reserved on the cluster's GPUs are refused before any engine starts (a real Ray, no GPU here), with
what to change, and no results file is written."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_apps_that_cannot_all_be_resident_are_refused_before_any_engine_starts(tmp_path):
    cfg = {"backend": "pytorch", "model": "/m", "tp": 1, "memory_fraction": 0.8, "max_batch_size": 64}
    table = {"schema_version": 2, "provenance": {"model": "/m", "gpu_type": "H200", "gpu_count": 1, "engine_versions": {},
                                                  "sweep_id": "s", "created_at": "now", "simulated": False},
             "buckets": [{"name": "le1024", "max_output_len": 1024, "config": cfg, "figures": {"output_throughput": 1.0}}]}
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "mixed_payoff.py"), "--table", str(path),
                          "--share-gpu", "--memory-fraction", "0.02", "--other-mixes", "", "--num-cpus", "1",
                          "--out-dir", str(tmp_path / "out"), "--work-dir", str(tmp_path / "work"), "--name", "refused"],
                         capture_output=True, text=True, timeout=240, cwd=ROOT, check=False,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})  # no GPU, also on a GPU host
    assert out.returncode != 0
    assert "the apps reserve 0.36 GPU(s) at once (2 apps and up to 1 cap engines), the cluster has 0" in out.stderr
    assert "--memory-fraction" in out.stderr and not (tmp_path / "out" / "refused.json").exists()
