"""Whole replicas on a fixed pool: a cell is kept only while it pays for the replica it takes, replicas
follow each config's work, and the plan is never predicted below the best single config on the same
GPUs."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.config import EngineConfig
from tuning.choose.cells import CellMeasurement, choose_cells
from tuning.choose.mix import part_rates, predict_mix
from tuning.choose.replicas import (
    mix_rate,
    plan_serving,
    size_replicas,
    work_per_config,
)


def _cfg(drafts: int) -> dict:
    cfg = {"backend": "sim", "model": "m", "tp": 8, "memory_fraction": 0.9}
    if drafts:
        cfg |= {"speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": drafts}
    return cfg


KEY = {d: EngineConfig.from_dict(_cfg(d)).key() for d in (0, 3)}


def _m(drafts, band, tput, bucket="le1024", in_flight=64):
    return CellMeasurement(config=_cfg(drafts), bucket=bucket, band=band, in_flight=in_flight,
                           throughputs=(tput * 0.99, tput, tput * 1.01))


# MTP-3 best greedy (100 vs 80 tok/s a replica), MTP off best sampled (100 vs 50): the sampled cell.
MEASURED = [_m(3, "greedy", 100), _m(0, "greedy", 80), _m(3, "sampled", 50), _m(0, "sampled", 100)]


def _engines(n: int):
    return lambda replicas: sum(replicas.values()) <= n


def _plan(shares, engines, measured=MEASURED, min_gain=0.0):
    choices = choose_cells(measured, primary_band="greedy", primary_in_flight=64)
    assert [c.engine_config().key() for c in choices["le1024"].cells] == [KEY[0]]  # the table has the cell
    return plan_serving(measured, choices, shares, in_flight=64, primary_band="greedy", fits=_engines(engines),
                        min_gain=min_gain)


def test_size_replicas_gives_the_next_replica_to_the_config_with_the_most_work_per_replica():
    assert size_replicas({"a": 3.0, "b": 1.0}, _engines(4)) == {"a": 3, "b": 1}
    assert size_replicas({"a": 3.0, "b": 1.0}, _engines(2)) == {"a": 1, "b": 1}
    assert size_replicas({"a": 3.0, "b": 1.0, "c": 1.0}, _engines(2)) is None
    assert mix_rate({"a": 3.0, "b": 1.0}, {"a": 3, "b": 1}) == pytest.approx(1.0)


def test_with_room_the_table_keeps_its_cell_and_sizes_replicas_by_work():
    plan = _plan({("le1024", "greedy"): 0.5, ("le1024", "sampled"): 0.5}, engines=4)
    assert plan.replicas == {KEY[3]: 2, KEY[0]: 2}
    assert plan.throughput == pytest.approx(400)  # each config's half at 100 tok/s a replica, two replicas each
    assert plan.single == (KEY[0], pytest.approx(4 / (0.5 / 80 + 0.5 / 100)))  # MTP off alone: 355.6
    assert plan.ratio == pytest.approx(400 / 355.56, rel=1e-3) and not plan.notes
    # uneven traffic: three quarters greedy -> three MTP-3 replicas, one MTP off
    uneven = _plan({("le1024", "greedy"): 0.75, ("le1024", "sampled"): 0.25}, engines=4)
    assert uneven.replicas == {KEY[3]: 3, KEY[0]: 1} and uneven.throughput == pytest.approx(400)


def test_a_cell_that_does_not_pay_for_its_replica_gives_way_to_one_config_everywhere():
    # Three engines: the two configs' equal work splits 2 + 1, so the table runs at 200 tok/s, while MTP
    # off on all three makes 267 — the cell is faster on its part and still loses overall.
    shares = {("le1024", "greedy"): 0.5, ("le1024", "sampled"): 0.5}
    plan = _plan(shares, engines=3)
    per_replica = predict_mix(MEASURED, choose_cells(MEASURED, primary_band="greedy", primary_in_flight=64), shares,
                              in_flight=64)
    assert per_replica.ratio > 1.1  # the prediction per replica says the table pays
    assert plan.replicas == {KEY[0]: 3} and plan.throughput == pytest.approx(3 / (0.5 / 80 + 0.5 / 100))
    c = plan.choices["le1024"]
    assert c.primary_key == KEY[0] and c.cells == () and c.primary_figures.output_throughput == pytest.approx(80)
    assert "would make 200 tok/s on whole replicas, the plan makes 267 without " + KEY[3] in plan.notes[0]


def test_a_table_within_min_gain_of_the_best_single_config_is_served_as_that_config():
    shares = {("le1024", "greedy"): 0.5, ("le1024", "sampled"): 0.5}
    assert _plan(shares, engines=4, min_gain=0.10).replicas == {KEY[3]: 2, KEY[0]: 2}  # 1.125x clears 10 %
    assert _plan(shares, engines=4, min_gain=0.15).replicas == {KEY[0]: 4}  # but not 15 %


def test_a_bucket_hands_its_primary_traffic_to_another_config():
    # Two buckets whose primaries differ by 2 %: one engine each starves the busy bucket, one config on
    # both engines serves the mix faster.
    measured = [_m(3, "greedy", 100, "le1024"), _m(0, "greedy", 98, "le1024"),
                _m(0, "greedy", 100, "le4096"), _m(3, "greedy", 50, "le4096")]
    choices = choose_cells(measured, primary_band="greedy", primary_in_flight=64)
    assert {b: c.primary_key for b, c in choices.items()} == {"le1024": KEY[3], "le4096": KEY[0]}
    plan = plan_serving(measured, choices, {("le1024", "greedy"): 0.9, ("le4096", "greedy"): 0.1}, in_flight=64,
                        primary_band="greedy", fits=_engines(2))
    assert {b: c.primary_key for b, c in plan.choices.items()} == {"le1024": KEY[0], "le4096": KEY[0]}
    assert plan.replicas == {KEY[0]: 2} and "without " + KEY[3] in plan.notes[0]


def test_the_plan_needs_the_tables_configs_measured_and_one_replica_each_to_fit():
    choices = choose_cells(MEASURED, primary_band="greedy", primary_in_flight=64)
    with pytest.raises(ValueError, match="does not fit"):
        plan_serving(MEASURED, choices, {("le1024", "greedy"): 0.5, ("le1024", "sampled"): 0.5}, in_flight=64,
                     primary_band="greedy", fits=_engines(1))
    with pytest.raises(ValueError, match="le4096"):
        plan_serving(MEASURED, choices, {("le4096", "greedy"): 1.0}, in_flight=64, primary_band="greedy",
                     fits=_engines(2))
    assert work_per_config({("le1024", "greedy", 8): KEY[3]}, {("le1024", "greedy", 8): 1.0},
                           {(KEY[3], "le1024", "greedy", 64): 100.0}) is None  # not measured at that load


RATES = st.floats(min_value=10, max_value=1000)


@settings(max_examples=150, deadline=None)
@given(rates=st.lists(RATES, min_size=8, max_size=8), greedy=st.floats(min_value=0.05, max_value=0.95),
       engines=st.integers(min_value=2, max_value=9))
def test_the_plan_is_never_below_the_best_single_config_on_the_same_gpus(rates, greedy, engines):
    measured = [_m(3, "greedy", rates[0]), _m(0, "greedy", rates[1]), _m(3, "sampled", rates[2]),
                _m(0, "sampled", rates[3]), _m(3, "greedy", rates[4], "le4096"), _m(0, "greedy", rates[5], "le4096"),
                _m(3, "sampled", rates[6], "le4096"), _m(0, "sampled", rates[7], "le4096")]
    choices = choose_cells(measured, primary_band="greedy", primary_in_flight=64)
    shares = {("le1024", "greedy"): greedy / 2, ("le1024", "sampled"): (1 - greedy) / 2,
              ("le4096", "greedy"): greedy / 2, ("le4096", "sampled"): (1 - greedy) / 2}
    plan = plan_serving(measured, choices, shares, in_flight=64, primary_band="greedy", fits=_engines(engines))
    assert plan.single is not None and plan.throughput >= plan.single[1] * (1 - 1e-9)
    # never below the table as chosen, on whole replicas of the same pool
    parts = {(b, band, 64): s for (b, band), s in shares.items()}
    own = work_per_config({p: choices[p[0]].key_for(p[1], 64) for p in parts}, parts, part_rates(measured))
    assert plan.throughput >= mix_rate(own, size_replicas(own, _engines(engines))) * (1 - 1e-9)
    # and its rate is what its own choices make on its replicas
    mine = work_per_config({p: plan.choices[p[0]].key_for(p[1], 64) for p in parts}, parts, part_rates(measured))
    assert mix_rate(mine, plan.replicas) == pytest.approx(plan.throughput)
    assert sum(plan.replicas.values()) <= engines
    # the plan's replicas serve exactly the configs its choices route to
    routed = {c.key_for(band, 64) for c in plan.choices.values() for band in ("greedy", "sampled")}
    assert routed == set(plan.replicas)


def test_a_table_of_more_configs_than_the_search_tries_is_kept_when_nothing_beats_it():
    # five buckets, each measured on its own config only: no set of at most four covers the mix
    measured = [CellMeasurement(config=_cfg(d) | {"max_batch_size": 8 * (i + 1)}, bucket=f"b{i}", band="greedy",
                                in_flight=64, throughputs=(100.0,)) for i, d in enumerate((0, 1, 2, 3, 4))]
    choices = choose_cells(measured, primary_band="greedy", primary_in_flight=64)
    plan = plan_serving(measured, choices, {(f"b{i}", "greedy"): 0.2 for i in range(5)}, in_flight=64,
                        primary_band="greedy", fits=_engines(5))
    assert plan.choices == choices and set(plan.replicas.values()) == {1} and len(plan.replicas) == 5
    assert plan.throughput == pytest.approx(500) and plan.single is None and not plan.notes
