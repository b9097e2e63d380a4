"""Routing table v3: every route names its engine and the version it was measured with, so a table
may mix engine families; v1/v2 tables keep loading, their engine read from their configs."""
from __future__ import annotations

import json

import pytest

from orchestrator import table
from orchestrator.fsutil import utc_now_iso
from orchestrator.table import RoutingTableError


def _lmdeploy(drafts: int = 0) -> dict:
    cfg = {"backend": "pytorch", "model": "/m", "tp": 1}
    return cfg | ({"speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": drafts} if drafts else {})


def _vllm(drafts: int = 0) -> dict:
    return _lmdeploy(drafts) | {"backend": "vllm"}


def _mixed(schema_version: int | None = None) -> dict:
    data = {
        "provenance": {"model": "/m", "gpu_type": "NVIDIA H200", "gpu_count": 1, "sweep_id": "t",
                       "created_at": utc_now_iso(), "simulated": False,
                       "engine_versions": {"lmdeploy": "0.18.0", "vllm": "0.26.0", "ray": "2.60.0"}},
        "default_temperature": 0.7,
        "buckets": [
            {"name": "le1024", "max_output_len": 1024, "config": _vllm(3), "figures": {"output_throughput": 900.0},
             "cells": [{"sampling": "sampled", "min_in_flight": 1, "config": _lmdeploy(0),
                        "figures": {"output_throughput": 800.0}}]},
            {"name": "le4096", "max_output_len": 4096, "config": _lmdeploy(2), "figures": {"output_throughput": 1000.0}},
        ],
    }
    return data if schema_version is None else data | {"schema_version": schema_version}


def test_a_new_table_names_each_routes_engine_and_version(tmp_path) -> None:
    committed = table.commit(_mixed(), tmp_path / "rt.json")
    assert committed.schema_version == 3
    written = json.loads((tmp_path / "rt.json").read_text())
    first = written["buckets"][0]
    assert (first["engine"], first["engine_version"]) == ("vllm", "0.26.0")
    assert (first["cells"][0]["engine"], first["cells"][0]["engine_version"]) == ("pytorch", "0.18.0")
    assert committed.engines() == {"vllm": "0.26.0", "pytorch": "0.18.0"}
    assert table.load(tmp_path / "rt.json") == committed


def test_a_simulated_engine_has_no_version() -> None:
    data = _mixed()
    data["buckets"][1]["config"] = {"backend": "sim", "simulated_backend": "vllm", "model": "intern-s2-preview-8xh200",
                                    "tp": 8}
    t = table.parse(data)
    assert (t.buckets[1].engine, t.buckets[1].engine_version) == ("vllm", None)


def test_a_version_2_table_loads_unchanged_with_its_configs_engines() -> None:
    t = table.parse(_mixed(schema_version=2))
    assert t.schema_version == 2 and t.buckets[0].engine is None
    assert t.buckets[0].engine_name == "vllm" and t.engines() == {"vllm": None, "pytorch": None}
    out = json.loads(t.to_json())
    assert "engine" not in out["buckets"][0] and "engine" not in out["buckets"][0]["cells"][0]
    assert table.parse(out) == t


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d["buckets"][0].update(engine="pytorch"), "engine 'pytorch' does not match its config's engine 'vllm'"),
    (lambda d: (d.update(schema_version=2), d["buckets"][0].update(engine="vllm")),
     "engine and engine_version on routes need schema_version 3"),
])
def test_inconsistent_engines_are_refused(mutate, message: str) -> None:
    data = _mixed()
    mutate(data)
    with pytest.raises(RoutingTableError, match=message):
        table.parse(data)
