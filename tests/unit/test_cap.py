"""The cap: the best routing of a mix's parts over configs measured alone on each part, on whole
replicas, and the table that serves it."""
from __future__ import annotations

import pytest

from orchestrator import table as routing
from orchestrator.config import EngineConfig
from tuning.choose.cap import CapPlan, best_routing, cap_table, pooled_rate


def _cfg(drafts: int) -> dict:
    cfg = {"backend": "sim", "model": "m", "tp": 1, "memory_fraction": 0.5}
    if drafts:
        cfg |= {"speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": drafts}
    return cfg


OFF, MTP = (EngineConfig.from_dict(_cfg(d)).key() for d in (0, 4))
CONFIGS = {OFF: _cfg(0), MTP: _cfg(4)}
SHORT, LONG = "le256", "le1024"

# MTP-4 wins greedy (150 vs 100 tok/s a replica), MTP off wins sampled (100 vs 60), in both buckets.
RATES = {(MTP, b, "greedy"): 150.0 for b in (SHORT, LONG)} | {(OFF, b, "greedy"): 100.0 for b in (SHORT, LONG)} \
    | {(MTP, b, "sampled"): 60.0 for b in (SHORT, LONG)} | {(OFF, b, "sampled"): 100.0 for b in (SHORT, LONG)}
HALVES = {(SHORT, "greedy"): 0.3, (LONG, "greedy"): 0.2, (SHORT, "sampled"): 0.3, (LONG, "sampled"): 0.2}


def _table() -> dict:
    return {"schema_version": 2, "provenance": {"model": "m", "gpu_type": "none (simulated)", "gpu_count": 0,
                                                 "engine_versions": {}, "sweep_id": "s", "created_at": "now", "simulated": True,
                                                 "gpu_budget": {"gpus": 2, "replicas": {OFF: 2}}},
            "buckets": [{"name": SHORT, "max_output_len": 256, "config": _cfg(0), "figures": {"output_throughput": 1.0}},
                        {"name": LONG, "max_output_len": 1024, "config": _cfg(0), "figures": {"output_throughput": 1.0}}]}


def test_parts_go_where_the_mix_is_fastest_on_whole_replicas():
    by_band = {p: (MTP if p[1] == "greedy" else OFF) for p in HALVES}
    plan = best_routing(RATES, HALVES, replicas=4)
    # Each band on its fastest config, two replicas each, makes 1 / max(0.5/150/2, 0.5/100/2) = 400 tok/s, no
    # more than MTP off on all four; moving the long greedy part to MTP off balances the whole replicas:
    # 0.3/150 on one MTP-4 replica, 0.7/100 on three MTP-off ones, 428.6 tok/s.
    assert plan.routes == by_band | {(LONG, "greedy"): OFF}
    assert plan.replicas == {MTP: 1, OFF: 3} and plan.single is None
    assert plan.rate == pytest.approx(1 / max(0.3 / 150, 0.7 / 100 / 3))
    best_single = max(4 / sum(s / RATES[(k, *p)] for p, s in HALVES.items()) for k in (OFF, MTP))
    assert best_single == pytest.approx(400) and plan.rate > best_single


def test_one_replica_leaves_one_config_and_a_dominant_config_is_the_cap_alone():
    one = best_routing(RATES, HALVES, replicas=1)
    assert one.single == OFF and one.replicas == {OFF: 1}  # MTP off loses less on greedy than MTP-4 on sampled
    dominant = {k: (v * 3 if k[0] == OFF else v) for k, v in RATES.items()}
    assert best_routing(dominant, HALVES, replicas=4) == CapPlan(
        routes={p: OFF for p in HALVES}, replicas={OFF: 4}, rate=pytest.approx(4 * 300.0))


def test_a_part_without_any_rate_and_a_search_too_large_are_refused():
    with pytest.raises(ValueError, match="le1024/sampled"):
        best_routing({k: v for k, v in RATES.items() if k[1:] != (LONG, "sampled")}, HALVES, replicas=2)
    with pytest.raises(ValueError, match="replicas"):
        best_routing(RATES, HALVES, replicas=0)
    many = {(f"k{i}", f"b{j}", "greedy"): 1.0 for i in range(10) for j in range(6)}
    with pytest.raises(ValueError, match="routings"):
        best_routing(many, {(f"b{j}", "greedy"): 1.0 for j in range(6)}, replicas=4)


def test_the_cap_table_routes_every_part_as_the_plan_does():
    plan = best_routing(RATES, HALVES, replicas=4)
    data = cap_table(_table(), plan, CONFIGS, RATES, primary_band="greedy")
    table = routing.parse(data)  # a valid table: the router can serve it
    assert table.provenance.gpu_budget is None  # the cap's replicas are its own, not the table's plan
    for (bucket, band), key in plan.routes.items():
        b = table.bucket(bucket)
        cell = b.cell_for(band, 1)
        assert (cell.engine_config() if cell else b.engine_config()).key() == key
    assert table.bucket(SHORT).cells[0].figures.output_throughput == 100.0  # the rate it was chosen from


def test_the_pooled_rate_bounds_every_routing_and_needs_every_part():
    # every part on its fastest (150 greedy, 100 sampled), four replicas' time split at will
    assert pooled_rate(RATES, HALVES, 4) == pytest.approx(4 / (0.5 / 150 + 0.5 / 100))  # 480 tok/s
    for n in (1, 2, 4, 7):
        assert best_routing(RATES, HALVES, n).rate <= pooled_rate(RATES, HALVES, n) * (1 + 1e-9)
    with pytest.raises(ValueError, match="le1024/sampled"):
        pooled_rate({k: v for k, v in RATES.items() if k[1:] != (LONG, "sampled")}, HALVES, 2)
