"""The reproducibility run's pure parts: what two tables must agree on (their routes, not their config
sets) and the stated mix turned into requests at each class's temperature."""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))

import measure_reproducibility as repro  # noqa: E402

from orchestrator import table as routing  # noqa: E402
from tuning.buckets import Bucket  # noqa: E402
from tuning.traffic import TrafficMix  # noqa: E402
from tuning.workload import load_tokenizer  # noqa: E402

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


def test_tables_measured_on_other_weights_are_refused_before_a_sweep_runs(monkeypatch, tmp_path):
    """Leases that share tables must measure one checkpoint: each sweep records its weights' sha256, and a
    later call whose checkpoint differs stops before it spends a lease on the other sweep."""
    import contextlib
    import json

    ckpt, work, out = tmp_path / "ckpt", tmp_path / "work", tmp_path / "out"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"weights of lease 1")
    ran: list[str] = []

    def run(cmd, **_kw):  # the sweep: its table in its run dir, which holds the weights record already
        run_dir = Path(cmd[cmd.index("--run-dir") + 1])
        assert (run_dir / repro.WEIGHTS_RECORD).exists()
        (run_dir / "routing_table.json").write_text("{}")
        (run_dir / "sweep.json").write_text(json.dumps({"seed": 0}))
        ran.append(run_dir.name)
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(repro.e2e, "run", run)
    monkeypatch.setattr(repro.e2e, "pack", lambda *a, **k: None)
    monkeypatch.setattr(repro.e2e, "sweep_cmd", lambda a, run_dir, **k: ["sweep", "--run-dir", str(run_dir), "--seed", "0"])
    monkeypatch.setattr(repro.e2e, "ray_cluster", lambda *a, **k: contextlib.nullcontext())
    base = ["--ckpt", str(ckpt), "--out", str(out), "--work", str(work)]
    assert repro.main([*base, "--sweeps", "a"]) == 0
    record = json.loads((work / "sweep-a" / repro.WEIGHTS_RECORD).read_text())
    assert record == repro.weights(str(ckpt), sim=False) and set(record["files"]) == {"model.safetensors"}
    (ckpt / "model.safetensors").write_bytes(b"weights trained again in lease 2")
    assert repro.main([*base, "--sweeps", "b", "--reuse"]) == 1
    said = json.loads((out / "reproducibility.json").read_text())
    assert ran == ["sweep-a"] and "sweep a measured model.safetensors " in said["error"]
    assert "tuning.checkpoint.build" in said["error"]
    # the same weights again (a built checkpoint is the same bytes every lease): sweep b runs
    (ckpt / "model.safetensors").write_bytes(b"weights of lease 1")
    assert repro.main([*base, "--sweeps", "b", "--reuse", "--no-side-by-side"]) == 0
    assert ran == ["sweep-a", "sweep-b"] and "error" not in json.loads((out / "reproducibility.json").read_text())
    assert repro.weights_differences(repro.weights(str(ckpt), sim=False), work, ["a", "b"]) == []
    assert repro.weights_differences({"simulated": True}, work, ["a"]) != []
    # a table without the record (from before it, or copied without it) is not shown to be on these weights
    (work / "sweep-b" / repro.WEIGHTS_RECORD).unlink()
    assert repro.main([*base, "--sweeps", "none", "--reuse"]) == 1
    said = json.loads((out / "reproducibility.json").read_text())
    assert "sweep b has no weights.json" in said["error"] and ran == ["sweep-a", "sweep-b"]
    with pytest.raises(SystemExit, match="no \\*.safetensors"):
        repro.weights(str(tmp_path), sim=False)
