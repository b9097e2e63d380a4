"""``--decide-starts K``: the decide rounds split over K fresh engines per config — the spec's rules, the
plan, and the flag's way from the command line into the spec."""
from __future__ import annotations

import argparse
import json

import pytest

from orchestrator.errors import ConfigError
from tests.unit.test_table_undecided_cells import BUCKETS as CELL_BUCKETS
from tests.unit.test_table_undecided_cells import _frame_and_table
from tuning.buckets import make_buckets
from tuning.sweep import SweepSpec, _parser, build_spec
from tuning.sweep.space import SearchSpace

BUCKETS = make_buckets((1024,), concurrency_levels=(64,), num_prompts=64, temperatures=(0.0, 0.8))


def _spec(tmp_path, **kw) -> SweepSpec:
    space = SearchSpace(engine="sim", model="m", tp=1, num_draft_tokens=(4,), memory_fraction=(0.8,)).with_baselines()
    return SweepSpec(sweep_id="t", run_dir=str(tmp_path), space=space, buckets=BUCKETS, **kw)


# ----- the spec ----------------------------------------------------------------------------------------
def test_the_spec_defaults_to_one_start_and_takes_a_multiple(tmp_path):
    assert _spec(tmp_path).decide_starts == 1
    assert _spec(tmp_path, decide_rounds=8).decide_starts == 1
    spec = _spec(tmp_path, decide_rounds=8, decide_starts=4)
    assert (spec.decide_rounds, spec.decide_starts) == (8, 4)
    assert _spec(tmp_path, decide_rounds=3, decide_starts=3).decide_starts == 3  # one round on each


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_the_spec_refuses_a_start_count_that_is_not_a_whole_number_from_one(tmp_path, bad):
    with pytest.raises(ConfigError, match="--decide-starts"):
        _spec(tmp_path, decide_rounds=4, decide_starts=bad)


@pytest.mark.parametrize(("rounds", "starts"), [(8, 3), (1, 2), (5, 2)])
def test_the_spec_refuses_rounds_that_do_not_split_evenly_and_says_what_would(tmp_path, rounds, starts):
    with pytest.raises(ConfigError) as e:
        _spec(tmp_path, decide_rounds=rounds, decide_starts=starts)
    msg = str(e.value)
    assert f"--decide-rounds {rounds}" in msg and f"--decide-starts {starts}" in msg
    assert f"use a multiple of {starts}" in msg


def test_the_spec_allows_starts_without_decide_rounds(tmp_path):
    """No decide phase: nothing to split, K is kept as given (a resumed spec with rounds raised keeps it)."""
    assert _spec(tmp_path, decide_rounds=0, decide_starts=3).decide_starts == 3


def test_the_starts_are_saved_and_an_older_sweep_json_loads_with_one(tmp_path):
    spec = _spec(tmp_path, decide_rounds=6, decide_starts=3)
    d = json.loads(json.dumps(spec.to_dict()))
    assert d["decide_starts"] == 3 and SweepSpec.from_dict(d) == spec
    old = {k: v for k, v in d.items() if k != "decide_starts"}  # a sweep.json from before the flag
    assert SweepSpec.from_dict(old).decide_starts == 1


# ----- the plan ----------------------------------------------------------------------------------------
def test_the_plan_splits_its_rounds_over_the_starts():
    from tuning.choose.decision import plan_decision

    df, table = _frame_and_table([1050, 1160])  # MTP off ~5 % ahead sampled, within noise: undecided
    one = plan_decision(df, CELL_BUCKETS, table, rounds=8)
    assert one is not None and one.starts == 1 and one.rounds_per_start == 8
    assert one.describe().endswith("2 config(s) to measure again on a fresh engine each, 8 rounds per cell")
    two = plan_decision(df, CELL_BUCKETS, table, rounds=8, starts=2)
    assert two is not None and (two.rounds, two.starts, two.rounds_per_start) == (8, 2, 4)
    assert two.points == one.points and two.buckets == one.buckets and two.undecided == one.undecided
    assert two.describe().startswith("1 cell comparison(s) within noise (le1024 sampled@64): 2 config(s)")
    assert two.describe().endswith("to measure again on 2 fresh engines each, 4 rounds per cell on each")
    each_once = plan_decision(df, CELL_BUCKETS, table, rounds=2, starts=2)
    assert each_once is not None and each_once.describe().endswith("1 round per cell on each")
    assert plan_decision(df, CELL_BUCKETS, table, rounds=0, starts=3) is None  # no decide phase


@pytest.mark.parametrize(("rounds", "starts"), [(8, 0), (8, -2), (8, 3), (1, 2)])
def test_the_plan_refuses_starts_that_do_not_split_the_rounds(rounds, starts):
    from tuning.choose.decision import plan_decision

    df, table = _frame_and_table([1050, 1160])
    with pytest.raises(ValueError, match="starts"):
        plan_decision(df, CELL_BUCKETS, table, rounds=rounds, starts=starts)


def test_a_plan_built_by_hand_is_checked_too():
    from tuning.choose.decision import DecisionPlan

    assert DecisionPlan((), {}, (), rounds=4).starts == 1
    with pytest.raises(ValueError, match="starts"):
        DecisionPlan((), {}, (), rounds=4, starts=3)


# ----- the command line --------------------------------------------------------------------------------
def test_the_flag_reaches_the_spec(tmp_path):
    argv = ["--run-dir", str(tmp_path / "r"), "--sim-profile", "intern-s2-preview-8xh200"]
    spec = build_spec(_parser().parse_args([*argv, "--decide-rounds", "6", "--decide-starts", "3"]), cluster_gpus=0)
    assert (spec.decide_rounds, spec.decide_starts) == (6, 3)
    spec = build_spec(_parser().parse_args([*argv, "--decide-rounds", "6"]), cluster_gpus=0)
    assert spec.decide_starts == 1  # default
    with pytest.raises(ConfigError, match="use a multiple of 4"):
        build_spec(_parser().parse_args([*argv, "--decide-rounds", "6", "--decide-starts", "4"]), cluster_gpus=0)
    with pytest.raises(ConfigError, match="--decide-starts"):  # 0 is refused, not read as the default
        build_spec(_parser().parse_args([*argv, "--decide-rounds", "6", "--decide-starts", "0"]), cluster_gpus=0)


def test_the_flag_is_explained_in_the_help():
    text = " ".join(_parser().format_help().split())
    assert "--decide-starts K" in text and "fresh engines per config" in text


def test_the_reproducibility_script_passes_the_flag_to_its_sweeps(tmp_path):
    """What ``benchmarks/gpu/measure_reproducibility.py`` adds to each sweep's command
    (:func:`tuning.reproducibility.sweep_flags`)."""
    from tuning import reproducibility as repro

    args = type("A", (), {"work": str(tmp_path), "reuse": False, "num_trials": 2, "time_budget_s": 10,
                          "temperatures": "0,0.8", "traffic_mix": "mix.yaml", "decide_rounds": 4,
                          "decide_starts": 2, "burn_in_s": None, "sim": True, "sweep_timeout_s": 5,
                          "baseline_memory_fraction": None, "sim_noise": None,
                          "out": str(tmp_path)})()
    cmd = repro.sweep_flags(args, repro.noise_space(args))
    assert cmd[cmd.index("--decide-rounds") + 1] == "4" and cmd[cmd.index("--decide-starts") + 1] == "2"
    assert "--baseline-memory-fraction" not in cmd
    assert cmd[cmd.index("--stop-after-s") + 1] == "10"  # never before the time budget
    args.baseline_memory_fraction = 0.06
    args.sweep_timeout_s = 1260
    cmd = repro.sweep_flags(args, repro.noise_space(args))
    assert cmd[cmd.index("--baseline-memory-fraction") + 1] == "0.06"
    # the sweep's own hard limit leaves it the margin to commit a table before the timeout kills it
    assert cmd[cmd.index("--stop-after-s") + 1] == f"{1260 - repro.STOP_MARGIN_S:g}"
    assert "--space" not in cmd and repro.noise_space(args) is None
    args.sim_noise = (0.05, 0.1)  # simulated engines that vary: the flags reach every engine of the space
    flags = repro.noise_space(args)["extra_flags"]
    assert flags[-4:] == ["--noise-start-sd", "0.05", "--noise-sd", "0.1"] and "--startup-delay" in flags
    cmd = repro.sweep_flags(args, tmp_path / "space-a.json")
    assert cmd[cmd.index("--space") + 1] == str(tmp_path / "space-a.json")
    with pytest.raises(argparse.ArgumentTypeError):
        repro.parse_sim_noise("0.05")


def test_the_reproducibility_script_can_run_one_sweep_now_and_the_other_later(tmp_path):
    """A sweep whose decide phase fills a lease runs alone (``--sweeps a``); the script then says how the
    other one follows, and serves nothing yet (:func:`tuning.reproducibility.stop_after_sweeps`). An unknown
    sweep name, or a serve-only call that cannot serve, is refused before anything starts."""
    import subprocess
    import sys
    from pathlib import Path

    from tuning import reproducibility as repro

    work = tmp_path / "work"
    specs = {"a": {"seed": 0, "buckets": "256,1024"}, "b": {"seed": 1, "buckets": "256,1024"}}

    def stop(run_now, argv, present, **kw):
        return repro.stop_after_sweeps(run_now, reuse="--reuse" in argv, present=present,
                                       no_side_by_side="--no-side-by-side" in argv, read_spec=specs.__getitem__,
                                       again=argv, work=work, script="measure_reproducibility.py", **kw)

    said = stop(["a"], ["--sim", "--out", "o", "--sweeps", "a"], {"a": True, "b": False})
    assert (said.key, said.rc) == ("next", 0)
    assert "--sim --out o --sweeps b --reuse --work <a copy of" in said.text
    # the later call: without --reuse sweep a's table is not taken; with it, a space that differs is refused
    said = stop(["b"], ["--sim", "--sweeps", "b"], {"a": True, "b": True})
    assert said.key == "next" and "sweep a has no table here yet" in said.text
    specs["b"] = {"seed": 1, "buckets": "1024"}
    said = stop(["b"], ["--sim", "--sweeps", "b", "--reuse"], {"a": True, "b": True})
    assert (said.key, said.rc) == ("error", 1) and "different spaces (buckets: '256,1024' vs '1024')" in said.text
    specs["b"] = {"seed": 1, "buckets": "256,1024"}  # seeds differ by design
    assert stop(["b"], ["--sim", "--sweeps", "b", "--reuse"], {"a": True, "b": True}) is None  # serve both
    # where the side by side does not fit the lease beside sweep b: it stops there and says how to serve them
    said = stop(["b"], ["--sim", "--sweeps", "b", "--reuse", "--no-side-by-side"], {"a": True, "b": True})
    assert said.key == "next" and "both tables are in" in said.text
    assert "--sweeps none --reuse --work <a copy of" in said.text and "--no-side-by-side" not in said.text
    # a sweep of this call that committed no table, and a serve-only call without both tables, are errors
    said = stop(["b"], ["--sweeps", "b", "--reuse"], {"a": True, "b": False})
    assert (said.key, said.rc) == ("error", 1) and "sweep b committed no table" in said.text
    said = stop([], ["--sweeps", "none", "--reuse"], {"a": True, "b": False})
    assert said.key == "error" and "no table of sweep b" in said.text
    root = Path(__file__).resolve().parents[2]
    for bad in (["--sweeps", "c"], ["--sweeps", "none"], ["--sweeps", "none", "--reuse", "--no-side-by-side"]):
        done = subprocess.run([sys.executable, "-m", "benchmarks.gpu.measure_reproducibility", "--sim", "--out",
                               str(tmp_path / "out"), "--work", str(work), *bad],
                              cwd=root, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and "--sweeps" in done.stderr, done.stderr  # argparse's error exit
    assert not work.exists()  # refused before anything started
