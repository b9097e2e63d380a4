"""A cell left on the primary because its comparison was within noise is named in the table's notes (the
summary and the report print them): it is where a second sweep may decide otherwise."""
from __future__ import annotations

from orchestrator.config import EngineConfig
from orchestrator.table import Provenance
from tests.bench_results import bench_result
from tuning.buckets import make_buckets
from tuning.choose.cells import undecided_cells
from tuning.choose.pick import pick_best
from tuning.results import results_frame, rows_for_trial
from tuning.sweep.space import ROLE_MTP_OFF, ROLE_STATIC

BUCKETS = make_buckets((1024,), concurrency_levels=(64,), num_prompts=64, temperatures=(0.0, 0.8))
PROV = Provenance(model="m", gpu_type="none (simulated)", gpu_count=0, sweep_id="t",
                  created_at="2026-12-04T00:00:00+00:00", simulated=True)


def _frame_and_table(sampled_off: list[float]):
    """Results and their table: MTP-4 clearly wins greedy (the primary); sampled, MTP off leads MTP-4 by
    ``sampled_off``'s rounds."""
    figures = {0: {0.0: [1000, 1100], 0.8: sampled_off}, 4: {0.0: [1500, 1650], 0.8: [1000, 1100]}}
    rows = []
    for tid, role, drafts in (("a", ROLE_MTP_OFF, 0), ("b", ROLE_STATIC, 4)):
        cfg = EngineConfig(backend="sim", model="m", tp=1, memory_fraction=0.8,
                           speculative_algorithm="qwen3_5_mtp" if drafts else None, num_draft_tokens=drafts)
        meas = {BUCKETS[0].measurement_key(64, t): bench_result(v) for t, v in figures[drafts].items()}
        rows += rows_for_trial(sweep_id="t", trial_id=tid, role=role, config=cfg, buckets=BUCKETS, measurements=meas)
    df = results_frame(rows)
    return df, pick_best(df, BUCKETS, provenance=PROV)


def _table(sampled_off: list[float]):
    return _frame_and_table(sampled_off)[1]


def test_an_undecided_cell_is_named_with_the_rounds_that_would_decide_it():
    table = _table([1050, 1160])  # ~1.05x MTP-4's sampled rounds, at ~10 % noise per round: not shown
    bucket = table.bucket("le1024")
    assert bucket.engine_config().num_draft_tokens == 4 and bucket.cells == ()
    notes = [n for n in table.provenance.notes if not n.startswith("noise:")]
    assert len(notes) == 1, table.provenance.notes
    assert notes[0].startswith("le1024 sampled@64:") and "within noise" in notes[0]
    assert "rounds per config would tell a gap this size apart" in notes[0] and "kept" in notes[0]


def test_a_decided_cell_leaves_no_such_note():
    table = _table([1600, 1700])  # sampled, MTP off well above MTP-4 (1,000 / 1,100): a cell
    assert [c.sampling for c in table.bucket("le1024").cells] == ["sampled"]
    assert [n for n in table.provenance.notes if not n.startswith("noise:")] == []


def test_the_decision_plan_measures_both_configs_on_the_undecided_cell_only():
    from tuning.choose.decision import plan_decision

    df, table = _frame_and_table([1050, 1160])
    assert plan_decision(df, BUCKETS, table, rounds=0) is None
    plan = plan_decision(df, BUCKETS, table, rounds=5)
    assert plan is not None and plan.rounds == 5
    assert [(u.bucket, u.band, u.in_flight) for u in plan.undecided] == [("le1024", "sampled", 64)]
    assert plan.undecided[0].kept_key == table.bucket("le1024").engine_config().key()  # MTP-4, the primary
    assert set(plan.points) == {plan.undecided[0].other_key, plan.undecided[0].kept_key}
    assert sorted(p["speculative"] for p in plan.points.values()) == [False, True]
    (cut,) = plan.buckets  # the sampled cell only: not the greedy primary cell again
    assert cut.name == "le1024" and cut.temperatures == (0.8,) and cut.concurrency_levels == (64,)
    assert cut.workload.temperature == 0.8 and cut.max_output_len == 1024
    assert "1 cell comparison(s) within noise (le1024 sampled@64): 2 config(s)" in plan.describe()


def test_a_decided_sweep_plans_nothing():
    from tuning.choose.decision import plan_decision

    df, table = _frame_and_table([1600, 1700])
    assert plan_decision(df, BUCKETS, table, rounds=5) is None


def test_decide_rows_never_stand_for_a_buckets_primary_cell():
    """A cut-down bucket measures every temperature x load of its undecided cells, the sweep's primary cell
    among them when the undecided cells span both; those rows are dropped, and none is a primary-load row."""
    from tuning.sweep.decide import sweep_rows
    from tuning.sweep.records import ResultRow

    def row(t: float, primary: bool) -> ResultRow:
        return ResultRow(sweep_id="t", trial_id="d", role="decide", status="ok", bucket="le1024", concurrency=64,
                         temperature=t, primary_load=primary, engine_key="k")

    kept = sweep_rows([row(0.0, True), row(0.8, True), row(0.8, False)], BUCKETS)
    assert [(r.temperature, r.primary_load) for r in kept] == [(0.8, False), (0.8, False)]
    assert sweep_rows([ResultRow(sweep_id="t", trial_id="d", role="decide", status="ok", bucket="other",
                                 concurrency=64, temperature=0.8)], BUCKETS) == []


def test_a_comparison_measured_again_already_is_not_planned_a_third_time():
    """A resumed sweep that only commits must not start engines again for a cell its earlier decide phase
    measured; one whose configs were not both measured again still is."""
    import pandas as pd

    from tuning.choose.decision import ROLE_DECIDE, plan_decision

    df, table = _frame_and_table([1050, 1160])
    sampled = df[(df["sampling_band"] == "sampled")]
    again = sampled.assign(role=ROLE_DECIDE, trial_id="d", primary_load=False)
    merged = pd.concat([df, again], ignore_index=True)
    assert undecided_cells(merged, BUCKETS, table)  # still not shown: only the decide rows keep it from the plan
    assert plan_decision(merged, BUCKETS, table, rounds=5) is None
    one = again[again["speculative"].astype(bool)]
    assert plan_decision(pd.concat([df, one], ignore_index=True), BUCKETS, table, rounds=5) is not None


def test_the_sweeps_plan_looks_past_the_one_config_rule(tmp_path):
    """A mix of mostly sampled requests: the table that kept the undecided sampled cell on MTP-4 predicts
    less than MTP off alone, so the sweep would commit MTP off everywhere. The sweep plans from the table
    before that rule: the comparison that tipped it, as pick_best left it (MTP-4 kept), is measured again."""
    from tuning.choose.decision import plan_decision
    from tuning.choose.table import choose_table, pick_for
    from tuning.sweep import SweepSpec
    from tuning.sweep.space import SearchSpace
    from tuning.traffic import TrafficMix

    df, _ = _frame_and_table([1050, 1160])
    space = SearchSpace(engine="sim", model="m", tp=1, num_draft_tokens=(4,), memory_fraction=(0.8,)).with_baselines()
    spec = SweepSpec(sweep_id="t", run_dir=str(tmp_path), space=space, buckets=BUCKETS, decide_rounds=3)
    mostly_sampled = TrafficMix.model_validate({"classes": [{"max_tokens": 1024, "temperature": 0.0, "share": 0.1},
                                                            {"max_tokens": 1024, "temperature": 0.8, "share": 0.9}]})
    committed = choose_table(df, spec, PROV, mostly_sampled)
    assert committed.bucket("le1024").engine_config().speculative_algorithm is None  # MTP off everywhere
    assert any(n.startswith("one config everywhere") for n in committed.provenance.notes)
    first = pick_for(df, spec, PROV)
    assert first.bucket("le1024").engine_config().num_draft_tokens == 4
    plan = plan_decision(df, BUCKETS, first, rounds=3)
    assert plan is not None and plan.rounds == 3
    assert [(u.bucket, u.band, u.in_flight) for u in plan.undecided] == [("le1024", "sampled", 64)]
    assert plan.undecided[0].kept_key == first.bucket("le1024").engine_config().key()


def test_a_kept_config_measured_best_but_not_shown_above_the_runner_up_is_undecided_too():
    """Sampled, MTP-4 (the primary) measured ~5 % above MTP off at ~10 % noise per round: the table keeps it
    either way, but a second sweep that measured MTP off above it beyond noise would write a cell. The
    comparison is named and planned like one whose best config is the other."""
    from tuning.choose.decision import plan_decision

    df, table = _frame_and_table([950, 1050])
    assert table.bucket("le1024").cells == ()
    notes = [n for n in table.provenance.notes if not n.startswith("noise:")]
    assert len(notes) == 1 and notes[0].startswith("le1024 sampled@64:") and "kept, not shown above it" in notes[0]
    (u,) = undecided_cells(df, BUCKETS, table)
    assert u.kept_key == table.bucket("le1024").engine_config().key() and u.other_key != u.kept_key
    plan = plan_decision(df, BUCKETS, table, rounds=4)
    assert plan is not None and set(plan.points) == {u.other_key, u.kept_key}
    # far below it (shown): decided, nothing named
    df, table = _frame_and_table([500, 520])
    assert undecided_cells(df, BUCKETS, table) == [] and plan_decision(df, BUCKETS, table, rounds=4) is None


def test_a_cell_from_a_lower_load_is_the_kept_config_at_a_higher_one():
    """Sampled, MTP off shown best at 8 in flight: a cell from one request up. At 64 in flight that cell's
    config serves the band; it measured best there too, but not shown above MTP-4: undecided, kept = MTP off."""
    from tuning.choose.cells import CellMeasurement, choose_cells
    from tuning.stats import PooledNoise

    off, mtp = ({"backend": "sim", "model": "m", "tp": 1, "memory_fraction": 0.8, **extra}
                for extra in ({}, {"speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": 4}))
    rounds = {("greedy", 64): ([1000, 1100], [1500, 1650]), ("sampled", 8): ([900, 950], [500, 520]),
              ("sampled", 64): ([1100, 1150], [1000, 1100])}
    measured = [CellMeasurement(config=cfg, bucket="le1024", band=band, in_flight=c, throughputs=tuple(r[i]))
                for (band, c), r in rounds.items() for i, cfg in enumerate((off, mtp))]
    noise = PooledNoise.of(m.throughputs for m in measured)
    choice = choose_cells(measured, primary_band="greedy", primary_in_flight=64, min_gain=0.03, noise=noise)["le1024"]
    key = {name: CellMeasurement(config=cfg, bucket="b", band="greedy", in_flight=1, throughputs=(1.0,)).engine_key
           for name, cfg in (("off", off), ("mtp", mtp))}
    assert choice.primary_key == key["mtp"]
    assert [(c.sampling, c.min_in_flight) for c in choice.cells] == [("sampled", 1)]
    (u,) = choice.undecided
    assert (u.band, u.in_flight, u.kept_key, u.other_key) == ("sampled", 64, key["off"], key["mtp"])
    (note,) = [n for n in choice.notes if n.startswith("sampled@64")]
    import re

    ratio = re.search(r"kept, not shown above it \((\d+\.\d+)x, 95 % (\d+\.\d+)-", note)
    assert ratio is not None, note
    assert float(ratio.group(1)) >= 1.0 and float(ratio.group(2)) <= 1.0  # kept over runner-up, interval holds 1


def test_a_kept_config_against_a_zero_throughput_runner_up_gives_no_ratio_but_no_error():
    from tuning.choose.cells import CellMeasurement, choose_cells
    from tuning.stats import PooledNoise

    cfg = {"backend": "sim", "model": "m", "tp": 1, "memory_fraction": 0.8}
    other = {**cfg, "speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": 4}
    measured = [CellMeasurement(config=cfg, bucket="b", band="greedy", in_flight=64, throughputs=(1000.0, 1100.0)),
                CellMeasurement(config=other, bucket="b", band="greedy", in_flight=64, throughputs=(900.0, 950.0)),
                CellMeasurement(config=cfg, bucket="b", band="sampled", in_flight=64, throughputs=(1000.0, 1100.0)),
                CellMeasurement(config=other, bucket="b", band="sampled", in_flight=64, throughputs=(0.0, 900.0))]
    choice = choose_cells(measured, primary_band="greedy", primary_in_flight=64,
                          noise=PooledNoise.of(m.throughputs for m in measured))["b"]
    assert choice.cells == () and choice.undecided == ()
