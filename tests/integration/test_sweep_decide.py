"""``--decide-rounds``: a cell comparison the first measurements leave within noise is measured again on
real Ray Tune trials with simulated engines, its rounds pooled with the first ones before the table is
chosen again."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import EngineConfig
from tests.bench_results import bench_result
from tuning.buckets import make_buckets
from tuning.choose.cells import cell_measurements
from tuning.choose.noise import pooled_noise
from tuning.results import results_frame, rows_for_trial
from tuning.sweep import SweepSpec
from tuning.sweep.records import ResultRow
from tuning.sweep.space import ROLE_MTP_OFF, ROLE_STATIC, SearchSpace

PROFILE = "intern-s2-preview-8xh200"
BUCKETS = make_buckets((512,), input_len=128, concurrency_levels=(16,), num_prompts=16, temperatures=(0.0, 0.8))
"""The decide tests' cell: what they check is which rows the decide phase adds, not the figures, so a light one
(at 64 in flight and 1024 tokens, the clients' 25k chunks a second fell behind beside other test files and each
round was measured again, up to 80 s a test)."""


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    yield
    ray.shutdown()


def _space() -> SearchSpace:
    return SearchSpace(engine="sim", model=PROFILE, tp=8, num_draft_tokens=(4,), memory_fraction=(0.8,),
                       max_batch_size=(64,), extra_flags=("--startup-delay", "1")).with_baselines()


def _spec(tmp_path: Path, **decide: int) -> SweepSpec:
    spec = SweepSpec(sweep_id="decide", run_dir=str(tmp_path / "decide"), space=_space(), buckets=BUCKETS,
                     sim_time_scale=2.0, steady_state=None, max_concurrent_trials=2, ready_timeout_s=60, repeats=2,
                     **decide)
    Path(spec.run_dir).mkdir(parents=True)
    return spec


def _measured(by_temperature: dict[float, list[float]]) -> dict:
    """The bench results of the decide tests' cell at its load: one per temperature, of these rounds."""
    cell = BUCKETS[0]
    return {cell.measurement_key(cell.primary_concurrency, t): bench_result(v) for t, v in by_temperature.items()}


def _first_rows(space: SearchSpace) -> tuple[list[ResultRow], dict[str, EngineConfig]]:
    """First measurements (as a sweep's trials report them): MTP-4 clearly ahead greedy, MTP off ~5 % ahead
    sampled at ~10 % noise per round: not shown, so the sampled cell stays on MTP-4."""
    figures = {ROLE_MTP_OFF: {0.0: [1000, 1100], 0.8: [1050, 1160]},
               ROLE_STATIC: {0.0: [1500, 1650], 0.8: [1000, 1100]}}
    rows: list[ResultRow] = []
    configs: dict[str, EngineConfig] = {}
    for point in space.points:
        cfg = space.config_from_trial_config(point.params)
        configs[point.role] = cfg
        rows += [ResultRow.from_mapping(r) for r in rows_for_trial(
            sweep_id="decide", trial_id=point.role, role=point.role, config=cfg, buckets=BUCKETS,
            measurements=_measured(figures[point.role]))]
    return rows, configs


def test_an_undecided_cell_is_measured_again_and_pooled(tmp_path):
    from tuning.sweep.decide import decide_phase as _decide

    spec = _spec(tmp_path, decide_rounds=2)
    space = spec.space
    rows, configs = _first_rows(space)

    all_rows, df, note = _decide(spec, rows, results_frame(rows))

    assert note is not None and note.startswith("decide: 1 cell comparison(s) within noise (le512 sampled@16)")
    added = all_rows[len(rows):]
    assert len(added) == 2 and {r.role for r in added} == {"decide"}
    assert {r.engine_key for r in added} == {c.key() for c in configs.values()}
    for r in added:  # the undecided cell only, R rounds each, on a real (simulated) engine
        assert (r.bucket, r.temperature, r.concurrency, r.status, r.primary_load) == ("le512", 0.8, 16, "ok", False)
        assert len(r.output_throughput_repeats.split(";")) == 2
    assert (Path(spec.run_dir) / "decide" / "trial-results").is_dir()
    # The sampled cell now has the first rounds and the new ones of each config, pooled.
    sampled = [m for m in cell_measurements(df, BUCKETS[0]) if m.band == "sampled"]
    assert sorted(len(m.throughputs) for m in sampled) == [4, 4]
    # A resumed sweep reads them back from RUN_DIR/decide.
    from tuning.sweep.decide import earlier_rows

    assert sorted(r.engine_key for r in earlier_rows(spec.run_dir, BUCKETS)) == sorted(r.engine_key for r in added)
    # Nothing left to decide is measured again: a plan-free sweep adds nothing.
    decided = {ROLE_MTP_OFF: {0.0: [1000, 1010], 0.8: [1600, 1610]}, ROLE_STATIC: {0.0: [1500, 1510], 0.8: [1000, 1010]}}
    clear = [ResultRow.from_mapping(r) for role, cfg in configs.items() for r in rows_for_trial(
        sweep_id="decide", trial_id=role, role=role, config=cfg, buckets=BUCKETS,
        measurements=_measured(decided[role]))]
    again, _, again_note = _decide(spec, clear, results_frame(clear))
    assert again_note is None and again == clear


def test_decide_rounds_split_over_fresh_engine_starts(tmp_path):
    """``--decide-rounds 2 --decide-starts 2``: each config gets two trials of one round each, every trial
    its own engine start, the configs' starts queued in alternation."""
    from tuning.results import repeat_throughputs
    from tuning.sweep.decide import decide_phase as _decide

    spec = _spec(tmp_path, decide_rounds=2, decide_starts=2)
    rows, configs = _first_rows(spec.space)

    all_rows, _, note = _decide(spec, rows, results_frame(rows))

    assert note is not None and note.startswith("decide: 1 cell comparison(s) within noise (le512 sampled@16)")
    assert "on 2 fresh engines each, 1 round per cell on each" in note and "(4 rows)" in note
    added = all_rows[len(rows):]
    assert len(added) == 4 and {r.role for r in added} == {"decide"}  # 2 configs x 2 starts
    by_key: dict[str, set[str]] = {}
    for r in added:
        assert (r.bucket, r.temperature, r.concurrency, r.status, r.primary_load) == ("le512", 0.8, 16, "ok", False)
        assert not r.output_throughput_repeats  # one round: no list of repeats, the row's one figure
        assert len(repeat_throughputs(r.to_dict())) == 1
        by_key.setdefault(r.engine_key, set()).add(r.trial_id)
    assert set(by_key) == {c.key() for c in configs.values()}
    assert all(len(trials) == 2 for trials in by_key.values())  # two engine starts per config
    assert len(set().union(*by_key.values())) == 4  # no trial shared between configs either
    logs = Path(spec.run_dir) / "decide" / "engine-logs"
    assert {p.name for p in logs.iterdir()} == {r.trial_id for r in added}  # each trial started its own engine
    # Tune numbers its grid in order: A1, B1, A2, B2.
    order = [r.engine_key for r in sorted(added, key=lambda r: r.trial_id)]
    assert order[0] != order[1] and order[:2] == order[2:]
    # Pooled, every trial is an engine start of its own: the comparison carries the variation between them.
    pooled = results_frame(all_rows)
    sampled = [m for m in cell_measurements(pooled, BUCKETS[0]) if m.band == "sampled"]
    assert [m.rounds_per_start for m in sampled] == [(2, 1, 1), (2, 1, 1)]
    noise = pooled_noise(pooled)
    assert noise is not None and noise.start_df == 2 * 2  # two configs, three starts each on the sampled cell


@pytest.mark.slow
def test_a_sweep_of_noisy_engines_decides_its_undecided_cells_before_it_commits(tmp_path):
    """End to end: ``run_sweep`` with ``decide_rounds`` on simulated engines that vary as GPU engines do
    (``--noise-start-sd``, ``--noise-sd``). At this noise (many short windows per round, so rounds move
    independently) and two rounds per config, the two sampled cells were left undecided in every one of 6
    trial runs, so the sweep's first table leaves cells undecided; the sweep then measures them on fresh engines, pools, chooses again
    and commits, the table's notes saying so. Should every comparison be decided by chance, the sweep must
    have planned nothing, which is checked instead."""
    from orchestrator import table as routing
    from tuning.choose.decision import plan_decision
    from tuning.choose.table import pick_for
    from tuning.sweep import run_sweep
    from tuning.sweep.provenance import provenance_for

    noisy = SearchSpace(engine="sim", model=PROFILE, tp=8, num_draft_tokens=(4,), memory_fraction=(0.8,),
                        max_batch_size=(64,), extra_flags=("--startup-delay", "1", "--noise-start-sd", "0.05",
                                                           "--noise-sd", "1.5", "--noise-window-s", "0.25")
                        ).with_baselines()
    buckets = make_buckets((256, 512), input_len=128, concurrency_levels=(8,), num_prompts=8,
                           temperatures=(0.0, 0.8))
    spec = SweepSpec(sweep_id="noisy", run_dir=str(tmp_path / "noisy"), space=noisy, buckets=buckets,
                     sim_time_scale=8.0, steady_state=None, max_concurrent_trials=2, ready_timeout_s=60, repeats=2,
                     decide_rounds=2, decide_starts=2)

    out = run_sweep(spec, num_trials=2, live=False)

    assert out.error is None, out.error
    engine_logs = list(Path(spec.run_dir).glob("**/engine-logs/*/*.log"))
    assert engine_logs and all("simulated run-to-run variation" in p.read_text() for p in engine_logs)
    table = routing.load(Path(spec.run_dir) / "routing_table.json")
    notes = [n for n in table.provenance.notes if n.startswith("decide:")]
    decide_rows = out.results[out.results.role == "decide"]
    first = out.results[out.results.role != "decide"]
    if decide_rows.empty:  # every comparison decided by chance on the first rounds: nothing was planned
        assert not notes
        assert plan_decision(first, spec.buckets, pick_for(first, spec, provenance_for(spec, first)),
                             spec.decide_rounds, spec.constraints, starts=spec.decide_starts) is None
        return
    assert len(notes) == 1 and "fresh engines each, 1 round per cell on each" in notes[0]
    assert (decide_rows.status == "ok").all()
    starts = decide_rows.groupby("engine_key").trial_id.nunique()
    # both configs, two fresh engines each per pass (a later pass, if the starts' variation asks for one,
    # starts two more)
    assert len(starts) == 2 and all(n % 2 == 0 for n in starts), starts
    logs = Path(spec.run_dir) / "decide" / "engine-logs"
    assert {p.name for p in logs.iterdir()} == set(decide_rows.trial_id)
    noise = pooled_noise(out.results)
    assert noise is not None and noise.start_df > 0  # the starts told apart, as on the GPU
