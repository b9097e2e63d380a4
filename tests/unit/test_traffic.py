"""Traffic mixes (mix file or request log -> shares per routing-table cell) and load profiles."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import table
from orchestrator.fsutil import utc_now_iso
from tuning.traffic import (
    LoadProfile,
    TrafficError,
    TrafficMix,
    load_mix,
    load_profile,
    mix_from_request_log,
)


def _table(default_temperature=0.7):
    cfg = {"backend": "sim", "model": "m", "tp": 1, "memory_fraction": 0.5}
    return table.parse({
        "provenance": {"model": "m", "gpu_type": "none (simulated)", "gpu_count": 0, "sweep_id": "t",
                       "created_at": utc_now_iso(), "simulated": True},
        "default_temperature": default_temperature,
        "buckets": [{"name": "le1024", "max_output_len": 1024, "config": cfg, "figures": {"output_throughput": 1.0}},
                    {"name": "le8192", "max_output_len": 8192, "config": cfg, "figures": {"output_throughput": 1.0}}],
    })


def test_mix_file_shares_per_cell_by_requests_and_by_tokens(tmp_path):
    path = tmp_path / "mix.yaml"
    path.write_text("default_temperature: 0.7\nclasses:\n"
                    "  - {max_tokens: 1000, temperature: 0.0, share: 3}\n"
                    "  - {max_tokens: 8000, share: 1}\n")
    mix = load_mix(path)
    assert mix.cell_shares(_table()) == {("le1024", "greedy"): 0.75, ("le8192", "sampled"): 0.25}
    by_tokens = mix.cell_shares(_table(), by="tokens")
    assert by_tokens[("le8192", "sampled")] == pytest.approx(8000 / (3000 + 8000))


def test_request_log_is_counted_with_defaults_and_body_wrappers():
    lines = [json.dumps({"max_tokens": 100, "temperature": 0}),
             json.dumps({"body": {"max_completion_tokens": 5000, "temperature": 0.8}}),
             "",
             json.dumps({"prompt": "x"}),  # no max_tokens, no temperature: the defaults
             json.dumps({"max_tokens": 100, "temperature": 0.0})]
    mix = mix_from_request_log(lines, default_temperature=0.7, default_max_tokens=1024)
    shares = mix.cell_shares(_table())
    assert shares == {("le1024", "greedy"): 0.5, ("le8192", "sampled"): 0.25, ("le1024", "sampled"): 0.25}


@pytest.mark.parametrize("line, message", [
    ("not json", "line 1: not JSON"),
    ("[1, 2]", "line 1: expected a JSON object"),
    (json.dumps({"max_tokens": 0}), "max_tokens=0"),
    (json.dumps({"max_tokens": True}), "max_tokens=True"),
    (json.dumps({"max_tokens": 5, "temperature": "hot"}), "temperature='hot'"),
    (json.dumps({"max_tokens": 5, "temperature": 9}), "temperature=9"),
])
def test_bad_request_log_lines_are_named(line, message):
    with pytest.raises(TrafficError, match=message):
        mix_from_request_log([line], default_temperature=0.7, default_max_tokens=16)


def test_bad_mixes_are_refused_with_the_field_named(tmp_path):
    with pytest.raises(TrafficError, match="request log holds no requests"):
        mix_from_request_log(["", "  "], default_temperature=None, default_max_tokens=16)
    with pytest.raises(TrafficError, match="default_temperature"):
        mix_from_request_log([json.dumps({"max_tokens": 5})], default_temperature=None, default_max_tokens=16)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"classes": [{"max_tokens": 5, "temperature": 0, "share": -1}]}))
    with pytest.raises(TrafficError, match="share"):
        load_mix(bad)
    bad.write_text("{")
    with pytest.raises(TrafficError, match="not valid JSON"):
        load_mix(bad)
    with pytest.raises(TrafficError, match="cannot read"):
        load_mix(tmp_path / "missing.yaml")
    closed = _table().model_copy(update={"sampling_bands": (table.SamplingBand(name="greedy", max_temperature=0.0),)})
    mix = TrafficMix.model_validate({"classes": [{"max_tokens": 5, "temperature": 0.5, "share": 1}]})
    with pytest.raises(TrafficError, match="no sampling band"):
        mix.cell_shares(closed)


def test_load_profile_steady_ramp_and_burst(tmp_path):
    path = tmp_path / "load.yaml"
    path.write_text("phases:\n  - {seconds: 10, concurrency: 8}\n  - {seconds: 10, ramp_to: 108}\n"
                    "  - {seconds: 5, concurrency: 256}\n")
    p = load_profile(path)
    assert p.seconds == 25
    assert [p.concurrency_at(t) for t in (0, 9.9, 10, 15, 19.9, 20, 24.9, 100)] == [8, 8, 8, 58, 107, 256, 256, 256]
    assert [p.phase_at(t) for t in (0, 10, 24, 30)] == [0, 1, 2, 2]


@pytest.mark.parametrize("data, message", [
    ({"phases": []}, "phases"),
    ({"phases": [{"seconds": 5, "ramp_to": 4}]}, "first phase cannot be a ramp"),
    ({"phases": [{"seconds": 5, "concurrency": 4, "ramp_to": 8}]}, "exactly one"),
    ({"phases": [{"seconds": 0, "concurrency": 4}]}, "seconds"),
    ({"phases": [{"seconds": 5, "concurrency": 0}]}, "concurrency"),
])
def test_bad_load_profiles_name_the_field(data, message):
    with pytest.raises(TrafficError, match=message):
        load_profile(data)


@settings(max_examples=100, deadline=None)
@given(levels=st.lists(st.integers(1, 512), min_size=2, max_size=6), t=st.floats(0, 100))
def test_a_ramp_stays_between_its_ends(levels, t):
    phases = [{"seconds": 10, "concurrency": levels[0]}] + [{"seconds": 10, "ramp_to": c} for c in levels[1:]]
    p = LoadProfile.model_validate({"phases": phases})
    c = p.concurrency_at(t)
    i = p.phase_at(t)
    lo, hi = sorted((levels[max(i - 1, 0)], levels[i]))
    assert lo <= c <= hi
