"""The decide phase in passes (:func:`tuning.sweep.decide.decide_phase`): once the rounds of fresh engines
show how far engine starts lie apart, a comparison the first rounds showed on one start per config can fall
within noise, and the next pass measures it too. The phase's own planning and choosing code runs; only the
engines' rounds are given (its ``measure``)."""
from __future__ import annotations

import dataclasses
from typing import Any

from tests.bench_results import bench_result
from tuning.buckets import make_buckets
from tuning.choose.decision import ROLE_DECIDE, DecisionPlan
from tuning.choose.noise import pooled_noise
from tuning.results import results_frame, rows_for_trial
from tuning.sweep import SweepSpec
from tuning.sweep.decide import MAX_DECIDE_PASSES, decide_phase, sweep_rows
from tuning.sweep.records import ResultRow
from tuning.sweep.space import ROLE_MTP_OFF, ROLE_STATIC, SearchSpace

BUCKETS = make_buckets((256, 1024), concurrency_levels=(64,), num_prompts=64, temperatures=(0.0, 0.8))
# First rounds, one engine start per config: MTP-4 wins greedy everywhere; sampled, MTP off is 20 % ahead on
# le256 (shown, at these rounds' ~1.4 % noise) and ~2 % ahead on le1024 (not shown: undecided).
FIRST = {ROLE_MTP_OFF: {("le256", 0.0): [1000, 1010], ("le256", 0.8): [1200, 1215],
                        ("le1024", 0.0): [1000, 1010], ("le1024", 0.8): [1020, 1060]},
         ROLE_STATIC: {("le256", 0.0): [1500, 1520], ("le256", 0.8): [1000, 1010],
                       ("le1024", 0.0): [1500, 1520], ("le1024", 0.8): [1000, 1030]}}


def _spec(tmp_path, rounds: int = 2, starts: int = 1) -> SweepSpec:
    space = SearchSpace(engine="sim", model="m", tp=1, num_draft_tokens=(4,), memory_fraction=(0.8,)).with_baselines()
    return SweepSpec(sweep_id="t", run_dir=str(tmp_path), space=space, buckets=BUCKETS, repeats=2,
                     decide_rounds=rounds, decide_starts=starts)


def _rows(spec: SweepSpec, figures: dict[str, dict[tuple[str, float], list[float]]], trial: str | None = None,
          role: str | None = None) -> list[ResultRow]:
    out: list[ResultRow] = []
    for point in spec.space.points:
        cfg = spec.space.config_from_trial_config(point.params)
        for b in BUCKETS:
            meas = {b.measurement_key(64, t): bench_result(v) for (name, t), v in figures.get(point.role, {}).items()
                    if name == b.name}
            if meas:
                out += [ResultRow.from_mapping(r) for r in rows_for_trial(
                    sweep_id="t", trial_id=f"{trial or point.role}-{point.role}", role=role or point.role, config=cfg,
                    buckets=[b], measurements=meas)]
    return out


class Engines:
    """The decide engines' rounds, pass by pass (the same for every start of a pass), recording each plan."""

    def __init__(self, spec: SweepSpec, passes: list[dict[str, dict[tuple[str, float], list[float]]]]) -> None:
        self.spec, self.passes, self.plans = spec, passes, []

    def __call__(self, spec: Any, plan: DecisionPlan) -> list[ResultRow]:
        self.plans.append(plan)
        figures = self.passes[len(self.plans) - 1]
        wanted = {(u.bucket, t) for b in plan.buckets for u in plan.undecided if u.bucket == b.name
                  for t in b.temperatures}
        rows = []
        for start in range(plan.starts):
            got = {role: {cell: v for cell, v in f.items() if cell in wanted} for role, f in figures.items()}
            rows += _rows(self.spec, got, trial=f"decide{len(self.plans)}-{start}", role=ROLE_DECIDE)
        return sweep_rows(rows, BUCKETS)


def test_a_comparison_that_falls_within_noise_once_starts_vary_is_measured_in_a_second_pass(tmp_path):
    spec = _spec(tmp_path)
    rows = _rows(spec, FIRST)
    # The decide engines of le1024 sampled land 20-25 % away from the first starts, in opposite directions:
    # the starts of one config lie far apart, and a 1.2x gap on one start each is no longer shown.
    engines = Engines(spec, [
        {ROLE_MTP_OFF: {("le1024", 0.8): [800, 805]}, ROLE_STATIC: {("le1024", 0.8): [1250, 1260]}},
        {ROLE_MTP_OFF: {("le256", 0.8): [1190, 1200]}, ROLE_STATIC: {("le256", 0.8): [1000, 1010]}}])

    all_rows, df, note = decide_phase(spec, rows, results_frame(rows), engines)

    assert [[(u.bucket, u.band) for u in p.undecided] for p in engines.plans] == [[("le1024", "sampled")],
                                                                                  [("le256", "sampled")]]
    assert len(all_rows) == len(rows) + 4 and len(df) == len(all_rows)
    assert note is not None and note.startswith("decide: 1 cell comparison(s) within noise (le1024 sampled@64)")
    assert "; then decide: 1 cell comparison(s) within noise (le256 sampled@64)" in note
    noise = pooled_noise(df)
    assert noise is not None and noise.start_df == 4 and noise.start_sd > 0.1


def test_without_start_variation_one_pass_does_it(tmp_path):
    """Decide engines that land where the first ones did: nothing new falls within noise, one pass."""
    spec = _spec(tmp_path, rounds=4, starts=2)
    rows = _rows(spec, FIRST)
    engines = Engines(spec, [
        {ROLE_MTP_OFF: {("le1024", 0.8): [1025, 1055]}, ROLE_STATIC: {("le1024", 0.8): [1005, 1025]}}])
    all_rows, _, note = decide_phase(spec, rows, results_frame(rows), engines)
    assert len(engines.plans) == 1 and engines.plans[0].starts == 2
    assert len(all_rows) == len(rows) + 4 and note is not None and "; then" not in note


def test_a_pass_that_measures_nothing_ends_the_phase(tmp_path):
    spec = _spec(tmp_path)
    rows = _rows(spec, FIRST)
    calls = []

    def nothing(spec: Any, plan: DecisionPlan) -> list[ResultRow]:
        calls.append(plan)
        return []

    all_rows, _, note = decide_phase(spec, rows, results_frame(rows), nothing)
    assert len(calls) == 1 and all_rows == rows
    assert note is not None and note.endswith("measured again: none (0 rows; none of 2 starts measured)")
    assert MAX_DECIDE_PASSES >= 2


def test_the_note_says_what_a_cut_pass_measured(tmp_path):
    """Starts that the time budget kept from starting, or rounds that the hard limit (``--stop-after-s``)
    cut: the note says how much of the plan was measured; a pass measured in full says nothing more."""
    spec = _spec(tmp_path, rounds=4, starts=2)
    rows = _rows(spec, FIRST)
    cut = Engines(spec, [{ROLE_MTP_OFF: {("le1024", 0.8): [1025]}, ROLE_STATIC: {("le1024", 0.8): [1005]}}])
    _, _, note = decide_phase(spec, rows, results_frame(rows), cut)
    assert note is not None and note.endswith("(4 rows; 4 of 4 starts, 1 of 2 rounds each)")
    full = Engines(spec, [{ROLE_MTP_OFF: {("le1024", 0.8): [1025, 1055]},
                           ROLE_STATIC: {("le1024", 0.8): [1005, 1025]}}])
    _, _, note = decide_phase(spec, rows, results_frame(rows), full)
    assert note is not None and note.endswith("(4 rows)")

    def one_failed(spec: Any, plan: DecisionPlan) -> list[ResultRow]:  # one start's engine failed
        good = full(spec, plan)
        bad = dataclasses.replace(good[0], status="failed", output_throughput=None, output_throughput_repeats=None,
                                  failure_reason="engine failed during bucket le1024")
        return [*good[1:], bad]

    full.plans.clear()
    _, _, note = decide_phase(spec, rows, results_frame(rows), one_failed)
    assert note is not None and note.endswith("(4 rows; 3 of 4 starts, 2 of 2 rounds each, 1 row(s) failed)")


def test_a_failing_pass_leaves_the_rows_as_they_were(tmp_path):
    spec = _spec(tmp_path)
    rows = _rows(spec, FIRST)

    def broken(spec: Any, plan: DecisionPlan) -> list[ResultRow]:
        raise RuntimeError("no GPU left")

    all_rows, _, note = decide_phase(spec, rows, results_frame(rows), broken)
    assert all_rows == rows and note is not None and "failed (RuntimeError: no GPU left)" in note


def test_a_cell_whose_engine_fails_is_not_planned_again(tmp_path):
    """Only one config of the comparison comes back (the other's engine failed): the cell is not measured
    again, so its measured_again rule does not hold; still, no later pass starts engines for it again."""
    spec = _spec(tmp_path)
    rows = _rows(spec, FIRST)
    engines = Engines(spec, [{ROLE_STATIC: {("le1024", 0.8): [1005, 1025]}}] * MAX_DECIDE_PASSES)
    all_rows, _, note = decide_phase(spec, rows, results_frame(rows), engines)
    assert len(engines.plans) == 1 and len(all_rows) == len(rows) + 1
    assert note is not None and "; then" not in note


def test_the_last_pass_says_what_it_left(tmp_path, monkeypatch):
    """At the cap, comparisons still within noise are named in the note, not measured."""
    import tuning.sweep.decide as decide

    monkeypatch.setattr(decide, "MAX_DECIDE_PASSES", 1)
    spec = _spec(tmp_path)
    rows = _rows(spec, FIRST)
    engines = Engines(spec, [
        {ROLE_MTP_OFF: {("le1024", 0.8): [800, 805]}, ROLE_STATIC: {("le1024", 0.8): [1250, 1260]}}])
    _, _, note = decide_phase(spec, rows, results_frame(rows), engines)
    assert len(engines.plans) == 1
    assert note is not None and "; then decide: stopped after 1 pass(es); still 1 cell comparison(s) within noise (le256 " in note
    assert note.endswith(", not measured")
