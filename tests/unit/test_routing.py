"""Routing table: schema validation, bucket lookup, atomic versioned commit that never loses a good table."""
from __future__ import annotations

import json
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import table as routing
from orchestrator.fsutil import utc_now_iso
from orchestrator.table import RoutingTableError


def _config(drafts: int = 0, mem: float = 0.8) -> dict:
    cfg = {"backend": "sim", "model": "intern-s2-preview-8xh200", "tp": 8, "memory_fraction": mem}
    if drafts:
        cfg |= {"speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": drafts}
    return cfg


def _table(**overrides) -> dict:
    data = {
        "provenance": {
            "model": "intern-s2-preview-8xh200",
            "gpu_type": "none (simulated)",
            "gpu_count": 0,
            "sweep_id": "test",
            "created_at": utc_now_iso(),
            "simulated": True,
        },
        "buckets": [
            {"name": "le1024", "max_output_len": 1024, "config": _config(0),
             "figures": {"output_throughput": 4600.0}},
            {"name": "le16384", "max_output_len": 16384, "config": _config(3),
             "figures": {"output_throughput": 12000.0, "accept_length": 3.6},
             "baselines": {"mtp_off": {"output_throughput": 6100.0}}, "gains": {"mtp_off": 0.97}},
        ],
    }
    data.update(overrides)
    return data


def test_valid_table_loads_and_routes_by_max_tokens():
    t = routing.parse(_table())
    assert t.bucket_for(1).name == "le1024"
    assert t.bucket_for(1024).name == "le1024"
    assert t.bucket_for(1025).name == "le16384"
    assert t.bucket_for(10**6).name == "le16384"  # above the last bound: last bucket
    assert t.bucket_for(None).name == "le1024"  # default_max_tokens = 1024
    assert len(t.distinct_configs()) == 2


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["buckets"].reverse(), "strictly increasing"),
        (lambda d: d["buckets"][1].update(name="le1024"), "unique"),
        (lambda d: d["buckets"][0]["config"].update(memory_fraction=2.0), "memory_fraction"),
        (lambda d: d["buckets"][0]["config"].update(backend="turbomind", speculative_algorithm="qwen3_5_mtp",
                                                  num_draft_tokens=2, model="m"), "turbomind"),
        (lambda d: d.update(buckets=[]), "buckets"),
        (lambda d: d.update(schema_version=99), "schema_version"),
        (lambda d: d["buckets"][0].update(surprise=1), "surprise"),
        (lambda d: d["provenance"].pop("sweep_id"), "sweep_id"),
    ],
)
def test_invalid_tables_are_refused_with_the_reason(mutate, message):
    data = _table()
    mutate(data)
    with pytest.raises(RoutingTableError, match=message):
        routing.parse(data)


def test_commit_versions_and_keeps_history(tmp_path):
    path = tmp_path / "routing_table.json"
    first = routing.commit(routing.parse(_table()), path)
    second = routing.commit(routing.parse(_table()), path)
    assert (first.version, second.version) == (1, 2)
    assert routing.load(path).version == 2
    hist = sorted(p.name for p in routing.history_dir(path).iterdir())
    assert hist == ["v1.json", "v2.json"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_invalid_candidate_never_replaces_a_good_table(tmp_path):
    path = tmp_path / "routing_table.json"
    routing.commit(_table(), path)
    before = path.read_bytes()
    bad = _table()
    bad["buckets"][0]["max_output_len"] = -5
    with pytest.raises(RoutingTableError):
        routing.commit(bad, path)
    assert path.read_bytes() == before


def test_corrupt_file_on_disk_is_refused_and_next_commit_continues_versions(tmp_path):
    path = tmp_path / "routing_table.json"
    routing.commit(_table(), path)
    path.write_text("{ not json")
    with pytest.raises(RoutingTableError, match=str(path.name)):
        routing.load(path)
    fixed = routing.commit(_table(), path)
    assert fixed.version == 2  # continues from the history, not from the corrupt file


def test_unwritable_output_gives_clear_error_and_keeps_old_table(tmp_path):
    """The history folder can't be created (a file is in the way; works as root too)."""
    path = tmp_path / "routing_table.json"
    routing.commit(_table(), path)
    before = path.read_bytes()
    hist = routing.history_dir(path)
    for f in hist.iterdir():
        f.unlink()
    hist.rmdir()
    hist.write_text("in the way")
    with pytest.raises(RoutingTableError, match="previous table is unchanged"):
        routing.commit(_table(), path)
    assert path.read_bytes() == before


def test_failed_write_leaves_previous_table(tmp_path, monkeypatch):
    """A write that fails mid-way (disk full) raises a clear error; the old file is intact."""
    path = tmp_path / "routing_table.json"
    routing.commit(_table(), path)
    before = path.read_bytes()

    def disk_full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(routing.os, "fsync", disk_full)
    with pytest.raises(RoutingTableError, match="No space left"):
        routing.commit(_table(), path)
    assert path.read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@settings(max_examples=150, deadline=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
))
def test_fuzzed_documents_either_load_or_raise_routing_table_error(doc):
    try:
        routing.parse(doc)
    except RoutingTableError:
        pass
    try:
        routing.parse(json.dumps(doc))
    except RoutingTableError:
        pass
