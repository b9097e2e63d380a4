"""Routing policy and request parsing: pure functions, no Ray, no processes."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.config import EngineConfig
from orchestrator.serve.metrics import AcceptLengthTracker, parse_prometheus_text
from orchestrator.serve.policy import NoHealthyDeploymentError, choose_route, requested_max_tokens
from orchestrator.serve.protocol import ApiError, parse_request
from orchestrator import table as routing
from orchestrator.fsutil import utc_now_iso

MODEL = "intern-s2-preview-8xh200"


def _cfg(drafts: int = 0, bs: int | None = None) -> dict:
    cfg = {"backend": "sim", "model": MODEL, "tp": 8, "max_batch_size": bs}
    if drafts:
        cfg |= {"speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": drafts}
    return cfg


def _key(cfg: dict) -> str:
    return EngineConfig.from_dict(cfg).key()


def _table(variants: bool = False) -> routing.RoutingTable:
    high = [{"min_concurrency": 32, "config": _cfg(1), "figures": {"output_throughput": 1.0}},
            {"min_concurrency": 128, "config": _cfg(0, 512), "figures": {"output_throughput": 1.0}}]
    return routing.parse({
        "provenance": {"model": MODEL, "gpu_type": "none", "gpu_count": 0, "sweep_id": "t",
                       "created_at": utc_now_iso(), "simulated": True},
        "buckets": [
            {"name": "le1024", "max_output_len": 1024, "config": _cfg(0), "figures": {"output_throughput": 1.0}},
            {"name": "le4096", "max_output_len": 4096, "config": _cfg(3), "figures": {"output_throughput": 1.0},
             "load_variants": high if variants else []},
            {"name": "le16384", "max_output_len": 16384, "config": _cfg(4), "figures": {"output_throughput": 1.0}},
        ],
        "default_max_tokens": 512,
    })


NOSPEC, MTP3, MTP4, MTP1, BIGBATCH = _key(_cfg(0)), _key(_cfg(3)), _key(_cfg(4)), _key(_cfg(1)), _key(_cfg(0, 512))


@pytest.mark.parametrize("max_tokens, bucket, deployment", [
    (None, "le1024", NOSPEC), (1, "le1024", NOSPEC), (1024, "le1024", NOSPEC), (1025, "le4096", MTP3),
    (16384, "le16384", MTP4), (10**6, "le16384", MTP4),
])
def test_bucket_by_max_tokens(max_tokens, bucket, deployment):
    d = choose_route(max_tokens, _table(), {})
    assert (d.bucket, d.deployment, d.config_key, d.fallback_from, d.reason) == (bucket, deployment, deployment, None, "bucket")
    assert d.fallback_header is None


def test_max_completion_tokens_wins():
    assert requested_max_tokens(100, 2000) == 2000
    assert requested_max_tokens(100, None) == 100
    assert requested_max_tokens(None, None) is None


def test_load_cells_switch_at_the_primary_load_per_replica_and_old_load_variants_read_as_them():
    t = _table(variants=True)  # written in the old form: load_variants
    assert [(c.sampling, c.min_in_flight) for c in t.bucket("le4096").cells] == [(None, 32), (None, 128)]
    assert "load_variants" not in t.to_json()
    assert choose_route(2000, t, {MTP3: 31.9}).deployment == MTP3
    for temperature in (None, 0.0, 1.0):  # a load cell of every band
        d = choose_route(2000, t, {MTP3: 32}, temperature=temperature)
        assert (d.deployment, d.reason, d.cell, d.bucket, d.fallback_from) == (MTP1, "cell:any@32", "any@32", "le4096", None)
    assert choose_route(2000, t, {MTP3: 500}).deployment == BIGBATCH
    # Load on other deployments is irrelevant to this bucket's choice.
    assert choose_route(2000, t, {MTP1: 1000, NOSPEC: 1000}).deployment == MTP3


def _old_rule(cells: list[dict], variants: list[dict], band: str | None, load: int) -> str | None:
    """How a bucket with both cells and load variants routed before load was a cell dimension: a matching
    cell first (the highest level; a band's own cell at a tie), else the highest variant reached."""
    fitting = [c for c in cells if c["sampling"] in (None, band) and c["min_in_flight"] <= load]
    if fitting:
        return _key(max(fitting, key=lambda c: (c["min_in_flight"], c["sampling"] is not None))["config"])
    reached = [v for v in variants if v["min_concurrency"] <= load]
    return _key(reached[-1]["config"]) if reached else None


@given(
    cells=st.dictionaries(st.tuples(st.sampled_from([None, "greedy", "sampled"]), st.sampled_from([1, 16, 32, 64, 128])),
                          st.integers(1, 4), max_size=5),
    levels=st.lists(st.sampled_from([1, 16, 24, 32, 64, 100, 128]), unique=True, max_size=3),
)
@settings(max_examples=300, deadline=None)
def test_a_hand_written_table_with_cells_and_load_variants_routes_as_it_did(cells, levels):
    cell_list = [{"sampling": band, "min_in_flight": n, "config": _cfg(d), "figures": {"output_throughput": 1.0}}
                 for (band, n), d in cells.items()]
    variants = [{"min_concurrency": n, "config": _cfg(0, 256 + n), "figures": {"output_throughput": 1.0}}
                for n in sorted(levels)]
    converted = routing.cells_of_load_variants(cell_list, variants)
    for band in ("greedy", "sampled"):
        for load in (1, 8, 16, 20, 24, 32, 50, 64, 100, 128, 1000):
            cell = routing.select_cell([routing.Cell(**c) for c in converted], band, load)
            assert (None if cell is None else cell.engine_config().key()) == _old_rule(cell_list, variants, band, load)


def test_load_variants_out_of_order_are_refused_with_the_bucket_named():
    data = json.loads(_table().to_json())
    data["buckets"][1]["load_variants"] = [
        {"min_concurrency": 64, "config": _cfg(1), "figures": {"output_throughput": 1.0}},
        {"min_concurrency": 32, "config": _cfg(2), "figures": {"output_throughput": 1.0}}]
    with pytest.raises(routing.RoutingTableError, match="le4096.*strictly increasing"):
        routing.parse(data)


def test_a_version_1_table_with_load_variants_reads_as_version_2():
    data = json.loads(_table(variants=True).to_json())
    data["schema_version"] = 1
    for b in data["buckets"]:
        for c in b.pop("cells", ()):
            b.setdefault("load_variants", []).append(
                {"min_concurrency": c["min_in_flight"], "config": c["config"], "figures": c["figures"]})
        b.pop("engine", None), b.pop("engine_version", None)
    t = routing.parse(data)
    assert t.schema_version == 2 and [c.min_in_flight for c in t.bucket("le4096").cells] == [32, 128]


def test_unhealthy_falls_back_within_bucket_then_to_nearest_bucket():
    t = _table(variants=True)
    d = choose_route(2000, t, {}, healthy={MTP1, NOSPEC, MTP4})
    assert (d.bucket, d.deployment, d.fallback_from) == ("le4096", MTP1, "le4096")
    d = choose_route(2000, t, {}, healthy={NOSPEC, MTP4})
    # Nearest on both sides: the tie goes to the larger bucket.
    assert (d.bucket, d.deployment, d.fallback_header) == ("le16384", MTP4, "le4096->le16384")
    d = choose_route(2000, t, {}, healthy={NOSPEC})
    assert (d.bucket, d.fallback_header) == ("le1024", "le4096->le1024")
    d = choose_route(100, t, {}, healthy={MTP4})
    assert d.fallback_header == "le1024->le16384"
    with pytest.raises(NoHealthyDeploymentError):
        choose_route(100, t, {}, healthy=set())


@given(
    max_tokens=st.one_of(st.none(), st.integers(1, 10**7)),
    loads=st.dictionaries(st.sampled_from([NOSPEC, MTP3, MTP4, MTP1, BIGBATCH]), st.floats(0, 1e4)),
    healthy=st.sets(st.sampled_from([NOSPEC, MTP3, MTP4, MTP1, BIGBATCH]), min_size=1),
)
@settings(max_examples=200, deadline=None)
def test_policy_always_picks_a_healthy_deployment_of_the_table(max_tokens, loads, healthy):
    t = _table(variants=True)
    d = choose_route(max_tokens, t, loads, healthy)
    assert d.deployment in healthy
    assert d.deployment in t.distinct_configs()
    wanted = t.bucket_for(max_tokens).name
    if d.fallback_from is None:
        assert d.bucket == wanted
    else:
        assert d.fallback_from == wanted


# ----- request parsing ------------------------------------------------------------------------------
NAMES = frozenset({MODEL})


def _parse(body, kind="chat", **kw):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_request(raw, kind, served_model_names=NAMES, max_tokens_limit=100_000, **kw)


def test_valid_requests_parse_and_get_the_model_filled_in():
    p = _parse({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "stream": True, "foo": 1})
    assert (p.max_tokens, p.stream, p.client_wants_usage, p.body["model"], p.body["foo"]) == (10, True, False, MODEL, 1)
    p = _parse({"prompt": "x", "max_completion_tokens": 7, "max_tokens": 3, "model": MODEL,
                "stream_options": {"include_usage": True}}, "completions")
    assert (p.max_tokens, p.client_wants_usage) == (7, True)
    assert _parse({"prompt": [1, 2, 3]}, "completions").max_tokens is None


@pytest.mark.parametrize("body, status, param", [
    (b"{not json", 400, None),
    (b"\xff\xfe{}", 400, None),
    (b"", 400, None),
    (b"[1, 2]", 400, None),
    ({"messages": []}, 400, "messages"),
    ({}, 400, "messages"),
    ({"messages": "hi"}, 400, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": -5}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**12}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5.5}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, 400, "stream"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 9}, 400, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "model": "gpt-4"}, 404, "model"),
    ({"messages": [{"role": "robot", "content": "x"}]}, 400, None),
])
def test_bad_chat_requests_are_openai_style_4xx(body, status, param):
    with pytest.raises(ApiError) as ei:
        _parse(body)
    e = ei.value
    assert e.status == status
    assert set(e.body()["error"]) == {"message", "type", "param", "code"}
    if param is not None:
        assert e.param == param, e


def test_missing_prompt_and_oversized_body():
    with pytest.raises(ApiError) as ei:
        _parse({"max_tokens": 5}, "completions")
    assert (ei.value.status, ei.value.param, ei.value.code) == (400, "prompt", "missing_required_field")
    with pytest.raises(ApiError) as ei:
        _parse(b"{" + b" " * 2048 + b"}", max_body_bytes=1024)
    assert ei.value.status == 413


@given(st.one_of(
    st.binary(max_size=300),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
        lambda children: st.lists(children, max_size=4) | st.dictionaries(
            st.sampled_from(["messages", "prompt", "max_tokens", "stream", "model", "role", "content",
                             "stream_options", "include_usage", "temperature", "n", "x"]), children, max_size=5),
        max_leaves=20,
    ).map(lambda v: json.dumps(v).encode()),
), st.sampled_from(["chat", "completions"]))
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_parser_never_raises_anything_but_api_error(raw, kind):
    try:
        p = parse_request(raw, kind, served_model_names=NAMES, max_tokens_limit=100_000)
    except ApiError as e:
        assert 400 <= e.status < 500
        json.dumps(e.body())
    else:
        assert p.body["model"] == MODEL
        assert p.max_tokens is None or 1 <= p.max_tokens <= 100_000


# ----- engine metrics helpers -----------------------------------------------------------------------
def test_prometheus_text_and_accept_length_from_counter_deltas():
    text = ("# HELP x\n# TYPE lmdeploy:spec_decode_num_accepted_tokens_total counter\n"
            'lmdeploy:spec_decode_num_accepted_tokens_total{model="m"} 100\n'
            "lmdeploy:spec_decode_num_draft_tokens_total 300\nlmdeploy:num_requests_running 4\ngarbage line here\n")
    s = parse_prometheus_text(text)
    assert s["lmdeploy:spec_decode_num_accepted_tokens_total"] == 100 and s["lmdeploy:num_requests_running"] == 4
    tr = AcceptLengthTracker(num_draft_tokens=3, window=12)
    assert tr.update(s, 0) is None  # first scrape: baseline only
    s2 = dict(s, **{"lmdeploy:spec_decode_num_accepted_tokens_total": 300.0,
                    "lmdeploy:spec_decode_num_draft_tokens_total": 600.0})
    assert tr.update(s2, 0) == pytest.approx(1 + 200 / (300 / 3))  # 3.0
    assert tr.update({"lmdeploy:spec_decode_num_accepted_tokens_total": 0.0,
                      "lmdeploy:spec_decode_num_draft_tokens_total": 0.0}, 0) == pytest.approx(3.0)  # reset: keep
    assert AcceptLengthTracker(0, window=12).update(s2, 0) is None


def test_serve_errors_derive_from_the_project_root_and_keep_their_builtin_bases():
    import pickle

    from orchestrator.errors import OrchestratorError
    from orchestrator.serve.replica import EngineUnavailableError

    assert issubclass(ApiError, OrchestratorError)
    for cls in (NoHealthyDeploymentError, EngineUnavailableError):
        assert issubclass(cls, OrchestratorError) and issubclass(cls, RuntimeError), cls
        # raised in an engine replica, caught in the router: they cross Ray pickled
        copy = pickle.loads(pickle.dumps(cls("why")))
        assert type(copy) is cls and str(copy) == "why"


# ----- routing table v2: cells by sampling band x load level ------------------------------------------
def _cell_table(default_temperature: float | None = 0.7) -> routing.RoutingTable:
    fig = {"output_throughput": 1.0}
    data = {
        "provenance": {"model": MODEL, "gpu_type": "none", "gpu_count": 0, "sweep_id": "t",
                       "created_at": utc_now_iso(), "simulated": True},
        "buckets": [
            {"name": "le1024", "max_output_len": 1024, "config": _cfg(4), "figures": fig,
             "cells": [{"sampling": "sampled", "min_in_flight": 1, "config": _cfg(0), "figures": fig},
                       {"sampling": "greedy", "min_in_flight": 64, "config": _cfg(1), "figures": fig}]},
            {"name": "le16384", "max_output_len": 16384, "config": _cfg(3), "figures": fig},
        ],
    }
    if default_temperature is not None:
        data["default_temperature"] = default_temperature
    return routing.parse(data)


@pytest.mark.parametrize("temperature, load, deployment, cell", [
    (0.0, 0, MTP4, "primary"),           # greedy, light load: the bucket's primary
    (0.0, 64, MTP1, "greedy@64"),        # greedy, full batches: the cell measured better there
    (0.8, 0, NOSPEC, "sampled@1"),       # sampled: MTP off
    (0.8, 100, NOSPEC, "sampled@1"),
    (None, 0, NOSPEC, "sampled@1"),      # no temperature: the engines' default (0.7) is sampled
])
def test_cells_route_by_temperature_and_live_load(temperature, load, deployment, cell):
    d = choose_route(100, _cell_table(), {MTP4: load}, temperature=temperature)
    assert (d.bucket, d.deployment, d.cell) == ("le1024", deployment, cell)
    assert d.reason == ("bucket" if cell == "primary" else f"cell:{cell}")


def test_without_a_default_temperature_an_unset_temperature_takes_the_primary():
    d = choose_route(100, _cell_table(default_temperature=None), {}, temperature=None)
    assert (d.deployment, d.cell) == (MTP4, "primary")


def test_an_unhealthy_cell_falls_back_within_its_bucket_then_to_the_nearest():
    d = choose_route(100, _cell_table(), {}, healthy={MTP4, MTP3}, temperature=0.8)
    assert (d.bucket, d.deployment, d.fallback_from, d.cell) == ("le1024", MTP4, "le1024", "sampled@1")
    d = choose_route(100, _cell_table(), {}, healthy={MTP3}, temperature=0.8)
    assert (d.bucket, d.deployment, d.fallback_from) == ("le16384", MTP3, "le1024")


def test_top_k_1_is_greedy_whatever_the_temperature():
    raw = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 5, "temperature": 0.9, "top_k": 1}).encode()
    parsed = parse_request(raw, "completions", served_model_names={MODEL}, max_tokens_limit=1 << 20)
    assert parsed.temperature == 0.0
    d = choose_route(parsed.max_tokens, _cell_table(), {}, temperature=parsed.temperature)
    assert d.deployment == MTP4
    raw = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 5}).encode()
    assert parse_request(raw, "completions", served_model_names={MODEL}, max_tokens_limit=1 << 20).temperature is None


@settings(max_examples=200, deadline=None)
@given(temperature=st.one_of(st.none(), st.floats(0, 2)), load=st.floats(0, 512), max_tokens=st.integers(1, 20000))
def test_a_cell_route_is_always_one_of_the_buckets_configs(temperature, load, max_tokens):
    t = _cell_table()
    d = choose_route(max_tokens, t, {MTP4: load, MTP3: load}, temperature=temperature)
    bucket = t.bucket(d.bucket)
    assert d.deployment in {c.key() for c in [bucket.engine_config(), *(c.engine_config() for c in bucket.cells)]}


def _limited_table() -> routing.RoutingTable:
    """le1024 on MTP off (batch limit 64), le4096 on MTP-3 (64), le16384 on MTP-4 (128), le65536 on MTP-1
    (no limit: the engine chooses)."""
    def bucket(name, bound, cfg):
        return {"name": name, "max_output_len": bound, "config": cfg, "figures": {"output_throughput": 1.0}}

    return routing.parse({
        "provenance": {"model": MODEL, "gpu_type": "none", "gpu_count": 0, "sweep_id": "t",
                       "created_at": utc_now_iso(), "simulated": True},
        "buckets": [bucket("le1024", 1024, _cfg(0, 64)), bucket("le4096", 4096, _cfg(3, 64)),
                    bucket("le16384", 16384, _cfg(4, 128)), bucket("le65536", 65536, _cfg(1))]})


OFF64, MTP3_64, MTP4_128, MTP1_AUTO = _key(_cfg(0, 64)), _key(_cfg(3, 64)), _key(_cfg(4, 128)), _key(_cfg(1))


def test_a_request_for_a_full_engine_spills_to_the_one_with_most_room():
    table = _limited_table()
    below = choose_route(1000, table, {OFF64: 63, MTP3_64: 10})
    assert (below.deployment, below.reason) == (OFF64, "bucket")  # room for one more: no spill
    full = choose_route(1000, table, {OFF64: 64, MTP3_64: 40, MTP4_128: 64})
    # MTP-4 has 64 of 128 taken (half), MTP-3 40 of 64 (62 %): the most room relative to the limit wins
    assert (full.bucket, full.deployment, full.reason) == ("le1024", MTP4_128, f"spill:{OFF64}-full")
    assert full.fallback_from is None and full.cell == "primary"
    assert choose_route(1000, table, {OFF64: 64, MTP3_64: 40, MTP4_128: 100}).deployment == MTP3_64
    assert choose_route(1000, table, {OFF64: 64, MTP3_64: 20}, healthy={OFF64, MTP4_128}).deployment == MTP4_128


def test_nobody_with_room_or_no_batch_limit_means_no_spill():
    table = _limited_table()
    everyone_full = {OFF64: 70, MTP3_64: 64, MTP4_128: 128, MTP1_AUTO: 0}
    assert choose_route(1000, table, everyone_full).deployment == OFF64  # MTP-1's engine chooses: no known room
    assert choose_route(10**5, table, {MTP1_AUTO: 10**4}).deployment == MTP1_AUTO  # no limit of its own


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(max_tokens=st.integers(1, 70000),
       loads=st.dictionaries(st.sampled_from([OFF64, MTP3_64, MTP4_128, MTP1_AUTO]), st.integers(0, 200)),
       healthy=st.sets(st.sampled_from([OFF64, MTP3_64, MTP4_128, MTP1_AUTO]), min_size=1))
def test_a_spill_goes_only_to_a_healthy_engine_with_room(max_tokens, loads, healthy):
    d = choose_route(max_tokens, _limited_table(), loads, healthy)
    assert d.deployment in healthy
    limits = {OFF64: 64, MTP3_64: 64, MTP4_128: 128}
    if d.reason.startswith("spill:"):
        assert d.deployment in limits and loads.get(d.deployment, 0) < limits[d.deployment]
        full = d.reason.removeprefix("spill:").removesuffix("-full")
        assert loads.get(full, 0) >= limits[full]
