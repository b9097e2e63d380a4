"""Routing table v2: cells keyed by sampling band x load level beside each bucket's primary config;
version 1 tables keep loading."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import table
from orchestrator.fsutil import utc_now_iso
from orchestrator.table import RoutingTableError


def _config(drafts: int = 0) -> dict:
    cfg = {"backend": "sim", "model": "intern-s2-preview-8xh200", "tp": 8, "memory_fraction": 0.8}
    if drafts:
        cfg |= {"speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": drafts}
    return cfg


def _v1_table() -> dict:
    return {
        "schema_version": 1,
        "provenance": {"model": "m", "gpu_type": "none (simulated)", "gpu_count": 0, "sweep_id": "t",
                       "created_at": utc_now_iso(), "simulated": True},
        "buckets": [
            {"name": "le1024", "max_output_len": 1024, "config": _config(3),
             "figures": {"output_throughput": 5300.0},
             "load_variants": [{"min_concurrency": 128, "config": _config(2),
                                "figures": {"output_throughput": 9000.0}}]},
            {"name": "le16384", "max_output_len": 16384, "config": _config(4),
             "figures": {"output_throughput": 12000.0}},
        ],
    }


def _v2_table() -> dict:
    data = _v1_table()
    data.pop("schema_version")
    data["buckets"][0].pop("load_variants")
    data["default_temperature"] = 0.7
    data["buckets"][0]["cells"] = [
        {"sampling": "sampled", "min_in_flight": 1, "config": _config(0),
         "figures": {"output_throughput": 4700.0, "output_throughput_ci": [4600.0, 4800.0], "rounds": 4},
         "primary_figures": {"output_throughput": 3100.0, "output_throughput_ci": [3000.0, 3200.0], "rounds": 4}},
        {"sampling": None, "min_in_flight": 64, "config": _config(2),
         "figures": {"output_throughput": 8000.0}},
        {"sampling": "sampled", "min_in_flight": 64, "config": _config(1),
         "figures": {"output_throughput": 7000.0}},
    ]
    return data


def test_version_1_table_reads_its_load_variants_as_load_cells_of_every_band():
    t = table.parse(_v1_table())
    assert t.schema_version == 2  # the first version with cells
    (cell,) = t.bucket("le1024").cells
    assert (cell.sampling, cell.min_in_flight, _drafts(cell)) == (None, 128, 2)
    assert t.bucket("le1024").cell_for("sampled", 127) is None
    assert _drafts(t.bucket("le1024").cell_for("sampled", 10_000)) == 2
    assert [b.name for b in t.sampling_bands] == ["greedy", "sampled"]
    assert table.parse(t.to_json()) == t


def test_version_1_table_without_load_variants_loads_unchanged():
    data = _v1_table()
    data["buckets"][0].pop("load_variants")
    t = table.parse(data)
    assert t.schema_version == 1 and [b.cells for b in t.buckets] == [(), ()]
    # what a v1 table writes back is still a v1 table: no v2 keys appear
    out = json.loads(t.to_json())
    assert "cells" not in out["buckets"][0] and "default_temperature" not in out
    assert table.parse(out) == t


def test_v2_written_by_default_and_round_trips(tmp_path):
    committed = table.commit(_v2_table(), tmp_path / "rt.json")
    assert committed.schema_version == table.SCHEMA_VERSION == 3
    again = table.load(tmp_path / "rt.json")
    assert again == committed
    cell = again.bucket("le1024").cells[0]
    assert cell.figures.output_throughput_ci == (4600.0, 4800.0)
    assert cell.gain() == pytest.approx(4700 / 3100 - 1)
    # every config a cell names is an engine the table needs
    assert len(again.distinct_configs()) == 5


@pytest.mark.parametrize(
    "temperature, band",
    [(0.0, "greedy"), (0.01, "sampled"), (0.8, "sampled"), (2.0, "sampled"), (None, "sampled")],
)
def test_band_for_temperature_and_the_engine_default(temperature, band):
    t = table.parse(_v2_table())  # default_temperature 0.7
    assert t.band_for(temperature).name == band


def test_without_default_temperature_a_request_without_one_has_no_band():
    t = table.parse(_v1_table())
    assert t.band_for(None) is None
    assert t.band_for(0).name == "greedy"


def _drafts(cell) -> int:
    return cell.engine_config().num_draft_tokens


def test_cell_for_picks_the_most_specific_cell_reached():
    b = table.parse(_v2_table()).bucket("le1024")
    assert b.cell_for("greedy", 1) is None                      # primary
    assert _drafts(b.cell_for("sampled", 1)) == 0        # the band's own cell
    assert _drafts(b.cell_for("greedy", 64)) == 2        # every-band cell at its load level
    assert _drafts(b.cell_for("sampled", 64)) == 1       # band cell beats every-band at equal level
    assert _drafts(b.cell_for("sampled", 63)) == 0
    assert _drafts(b.cell_for(None, 100)) == 2           # unknown band: only every-band cells


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["buckets"][0]["cells"][0].update(sampling="hot"), "sampling band 'hot'"),
        (lambda d: d["buckets"][0]["cells"][2].update(sampling=None), r"same \(sampling, min_in_flight\)"),
        (lambda d: d["buckets"][0]["cells"][0].update(min_in_flight=0), "min_in_flight"),
        (lambda d: d["buckets"][0]["cells"][0]["config"].update(num_draft_tokens=99), "num_draft_tokens"),
        (lambda d: d["buckets"][0]["cells"][0]["figures"].update(output_throughput_ci=[5, 4]), "low <= high"),
        (lambda d: d.update(sampling_bands=[{"name": "a"}, {"name": "b", "max_temperature": 1.0}]), "last"),
        (lambda d: d.update(sampling_bands=[{"name": "a", "max_temperature": 0.5},
                                            {"name": "b", "max_temperature": 0.5}]), "strictly increasing"),
        (lambda d: d.update(sampling_bands=[{"name": "a", "max_temperature": 0.5},
                                            {"name": "a"}]), "unique"),
        (lambda d: d.update(schema_version=1), "need schema_version 2"),
        (lambda d: d.update(schema_version=4), "schema_version 4 is not supported"),
    ],
)
def test_invalid_v2_tables_are_refused_with_the_field_named(mutate, message):
    data = _v2_table()
    mutate(data)
    with pytest.raises(RoutingTableError, match=message):
        table.parse(data)


def test_an_invalid_v2_table_never_replaces_a_good_one(tmp_path):
    path = tmp_path / "rt.json"
    good = table.commit(_v2_table(), path)
    bad = _v2_table()
    bad["buckets"][0]["cells"][0]["sampling"] = "nope"
    with pytest.raises(RoutingTableError):
        table.commit(bad, path)
    assert table.load(path) == good


@settings(max_examples=200, deadline=None)
@given(bounds=st.lists(st.floats(min_value=0, max_value=2, allow_nan=False), min_size=1, max_size=4, unique=True),
       t=st.floats(min_value=0, max_value=3, allow_nan=False))
def test_every_temperature_falls_in_the_first_band_that_holds_it(bounds, t):
    bounds = sorted(bounds)
    data = _v2_table()
    data["buckets"][0].pop("cells")
    data["sampling_bands"] = [{"name": f"b{i}", "max_temperature": b} for i, b in enumerate(bounds)] + [{"name": "rest"}]
    rt = table.parse(data)
    band = rt.band_for(t)
    expected = next((f"b{i}" for i, b in enumerate(bounds) if t <= b), "rest")
    assert band.name == expected
