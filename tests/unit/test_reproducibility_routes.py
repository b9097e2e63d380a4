"""The reproducibility run's pure parts (:mod:`tuning.reproducibility`, what
``benchmarks/gpu/measure_reproducibility.py`` runs on): what two tables must agree on (their routes, not their
config sets), the stated mix turned into requests at each class's temperature, and the weights both sweeps
must have measured, refused by the script before it spends a lease."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from orchestrator import table as routing
from tuning import reproducibility as repro
from tuning.buckets import Bucket
from tuning.traffic import TrafficMix
from tuning.workload import load_tokenizer

ROOT = Path(__file__).resolve().parents[2]

OFF = {"backend": "pytorch", "model": "m", "num_draft_tokens": 0, "memory_fraction": 0.8, "max_batch_size": 64}
MTP4 = {**OFF, "speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": 4}
FIG = {"output_throughput": 1000.0}
PROVENANCE = {"model": "m", "gpu_type": "test", "gpu_count": 1, "sweep_id": "t", "created_at": "2026-12-04T00:00:00Z",
              "simulated": True}


def _table(le1024_cells: list[dict]) -> routing.RoutingTable:
    sampled_off = {"sampling": "sampled", "min_in_flight": 1, "config": OFF, "figures": FIG}
    return routing.parse({"provenance": PROVENANCE, "buckets": [
        {"name": "le256", "max_output_len": 256, "config": MTP4, "figures": FIG, "cells": [sampled_off]},
        {"name": "le1024", "max_output_len": 1024, "config": MTP4, "figures": FIG, "cells": le1024_cells},
    ]})


def test_same_config_set_but_different_routing_is_told_apart():
    """Both tables use MTP off and MTP-4 (the config sets match), but only one sends sampled 1,024-token
    requests to MTP off: the comparison names exactly those routes."""
    a = _table([{"sampling": "sampled", "min_in_flight": 1, "config": OFF, "figures": FIG}])
    b = _table([])
    assert set(a.distinct_configs()) == set(b.distinct_configs())
    ra, rb = repro.routes(a, [1, 64]), repro.routes(b, [1, 64])
    assert len(ra) == 2 * 2 * 2  # buckets x bands x levels
    diff = repro.route_differences(ra, rb)
    assert [d.split(":")[0] for d in diff] == ["le1024 sampled@1", "le1024 sampled@64"]
    assert "nospec" in diff[0].split(" vs ")[0] and "mtp4" in diff[0].split(" vs ")[1]
    assert repro.route_differences(ra, repro.routes(_table([{"sampling": "sampled", "min_in_flight": 1,
                                                               "config": OFF, "figures": FIG}]), [1, 64])) == []


def test_a_cell_from_a_higher_load_only_differs_there():
    a = _table([{"sampling": "sampled", "min_in_flight": 32, "config": OFF, "figures": FIG}])
    diff = repro.route_differences(repro.routes(a, [1, 64]), repro.routes(_table([]), [1, 64]))
    assert [d.split(":")[0] for d in diff] == ["le1024 sampled@64"]


@pytest.fixture(scope="module")
def buckets() -> list[Bucket]:
    def bucket(n: int) -> Bucket:
        return Bucket.from_dict({"name": f"le{n}", "max_output_len": n, "concurrency_levels": [8],
                                 "temperatures": [0.0, 0.8],
                                 "workload": {"dataset": "random", "input_len": 64, "output_len": n,
                                              "range_ratio": 0.5, "num_prompts": 16, "max_concurrency": 8,
                                              "seed": 0, "name": f"le{n}"}})
    return [bucket(256), bucket(1024)]


def test_mix_requests_follow_the_classes(buckets):
    mix = TrafficMix.model_validate({"default_temperature": 0.7, "classes": [
        {"max_tokens": 256, "temperature": 0.0, "share": 3},
        {"max_tokens": 1024, "temperature": 0.8, "share": 1},
        {"max_tokens": 128, "share": 1}]})  # the mix's default temperature; lengths capped at 128
    reqs = repro.mix_requests(buckets, mix, load_tokenizer(None), total=100)
    assert Counter(t for _, _, t in reqs) == {0.0: 60, 0.8: 20, 0.7: 20}
    assert all(n <= 256 for _, n, t in reqs if t == 0.0)
    assert all(n <= 128 for _, n, t in reqs if t == 0.7)
    assert any(n > 256 for _, n, t in reqs if t == 0.8)  # drawn from the 1,024-token bucket's workload
    assert reqs == repro.mix_requests(buckets, mix, load_tokenizer(None), total=100)  # seeded
    assert [r[2] for r in reqs] != sorted(r[2] for r in reqs)  # shuffled, not class by class


def test_a_sweeps_weights_record_tells_other_weights_apart(tmp_path):
    """Each sweep records its weights' sha256; a table is shown to be on this run's weights only by a record
    equal to this run's (a built checkpoint is the same bytes every lease), never by a missing one."""
    ckpt, work = tmp_path / "ckpt", tmp_path / "work"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"weights of lease 1")
    now = repro.weights(str(ckpt), sim=False)
    assert set(now["files"]) == {"model.safetensors"}
    for tag in ("a", "b"):
        (work / f"sweep-{tag}").mkdir(parents=True)
        (work / f"sweep-{tag}" / repro.WEIGHTS_RECORD).write_text(json.dumps(now))
    assert repro.weights_differences(now, work, ["a", "b"]) == []
    assert repro.weights_differences({"simulated": True}, work, ["a"]) == [
        f"sweep a measured model.safetensors {now['files']['model.safetensors'][:16]}, this run has simulated engines"]
    (ckpt / "model.safetensors").write_bytes(b"weights trained again in lease 2")
    (diff,) = repro.weights_differences(repro.weights(str(ckpt), sim=False), work, ["b"])
    assert diff.startswith("sweep b measured model.safetensors ") and diff.count("model.safetensors") == 2
    (work / "sweep-b" / repro.WEIGHTS_RECORD).unlink()  # from before the record, or copied without it
    assert repro.weights_differences(now, work, ["b"]) == ["sweep b has no weights.json (its weights are unknown)"]
    with pytest.raises(SystemExit, match="no \\*.safetensors"):
        repro.weights(str(tmp_path), sim=False)


def test_tables_measured_on_other_weights_are_refused_before_a_sweep_runs(tmp_path):
    """Leases that share tables must measure one checkpoint: a later call whose checkpoint differs from the
    earlier sweep's record stops before it spends a lease on the other sweep (the script as a user runs it;
    it stops before Ray starts)."""
    ckpt, work, out = tmp_path / "ckpt", tmp_path / "work", tmp_path / "out"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"weights of lease 1")
    (work / "sweep-a").mkdir(parents=True)
    (work / "sweep-a" / "routing_table.json").write_text("{}")
    (work / "sweep-a" / repro.WEIGHTS_RECORD).write_text(json.dumps(repro.weights(str(ckpt), sim=False)))
    (ckpt / "model.safetensors").write_bytes(b"weights trained again in lease 2")
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu.measure_reproducibility", "--ckpt", str(ckpt),
                           "--out", str(out), "--work", str(work), "--sweeps", "b", "--reuse"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    said = json.loads((out / "reproducibility.json").read_text())
    assert "sweep a measured model.safetensors " in said["error"] and "tuning.checkpoint.build" in said["error"]
    assert not (work / "sweep-b").exists()  # sweep b never started
