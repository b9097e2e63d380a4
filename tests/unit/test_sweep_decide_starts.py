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


def test_the_reproducibility_script_passes_the_flag_to_its_sweeps(monkeypatch, tmp_path):
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    monkeypatch.syspath_prepend(str(root / "benchmarks" / "gpu"))
    import measure_reproducibility as repro

    seen: dict[str, list[str]] = {}

    def run(cmd, **_kw):
        seen["cmd"] = list(cmd)
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(repro.e2e, "run", run)
    monkeypatch.setattr(repro.e2e, "pack", lambda *a, **k: None)
    monkeypatch.setattr(repro.e2e, "sweep_cmd", lambda *a, **k: [sys.executable, "-m", "tuning.sweep", "--seed", "0"])
    args = type("A", (), {"work": str(tmp_path), "reuse": False, "num_trials": 2, "time_budget_s": 10,
                          "temperatures": "0,0.8", "traffic_mix": "mix.yaml", "decide_rounds": 4,
                          "decide_starts": 2, "burn_in_s": None, "sim": True, "sweep_timeout_s": 5,
                          "baseline_memory_fraction": None, "sim_noise": None,
                          "out": str(tmp_path)})()
    repro.sweep("a", args, {"simulated": True})
    cmd = seen["cmd"]
    assert cmd[cmd.index("--decide-rounds") + 1] == "4" and cmd[cmd.index("--decide-starts") + 1] == "2"
    assert "--baseline-memory-fraction" not in cmd
    assert cmd[cmd.index("--stop-after-s") + 1] == "10"  # never before the time budget
    args.baseline_memory_fraction = 0.06
    args.sweep_timeout_s = 1260
    repro.sweep("a", args, {"simulated": True})
    cmd = seen["cmd"]
    assert cmd[cmd.index("--baseline-memory-fraction") + 1] == "0.06"
    # the sweep's own hard limit leaves it the margin to commit a table before the timeout kills it
    assert cmd[cmd.index("--stop-after-s") + 1] == f"{1260 - repro.STOP_MARGIN_S:g}"
    assert "--space" not in cmd
    args.sim_noise = (0.05, 0.1)  # simulated engines that vary: the flags reach every engine of the space
    repro.sweep("a", args, {"simulated": True})
    cmd = seen["cmd"]
    flags = json.loads(Path(cmd[cmd.index("--space") + 1]).read_text())["extra_flags"]
    assert flags[-4:] == ["--noise-start-sd", "0.05", "--noise-sd", "0.1"] and "--startup-delay" in flags
    with pytest.raises(argparse.ArgumentTypeError):
        repro._noise("0.05")


def test_the_reproducibility_script_can_run_one_sweep_now_and_the_other_later(monkeypatch, tmp_path):
    """A sweep whose decide phase fills a lease runs alone (``--sweeps a``); the script then says how the
    other one follows, and serves nothing yet. An unknown sweep name is refused before anything starts."""
    import contextlib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    monkeypatch.syspath_prepend(str(root / "benchmarks" / "gpu"))
    import measure_reproducibility as repro

    ran: list[str] = []

    def sweep(tag, a, record):
        ran.append(tag)
        table = Path(a.work) / f"sweep-{tag}" / "routing_table.json"
        table.parent.mkdir(parents=True, exist_ok=True)
        table.write_text("{}")
        (table.parent / "sweep.json").write_text(json.dumps({"seed": repro.SEEDS[tag], "buckets": a.buckets}))
        (table.parent / repro.WEIGHTS_RECORD).write_text(json.dumps(record))
        return {"rc": 0, "wall_s": 1.0}

    monkeypatch.setattr(repro, "sweep", sweep)
    monkeypatch.setattr(repro.e2e, "ray_cluster", lambda *a, **k: contextlib.nullcontext())
    out, work = tmp_path / "out", tmp_path / "work"
    assert repro.main(["--sim", "--out", str(out), "--work", str(work), "--sweeps", "a"]) == 0
    assert ran == ["a"]
    said = json.loads((out / "reproducibility.json").read_text())
    assert "--sim --out " in said["next"] and "--sweeps b --reuse --work <a copy of" in said["next"]
    assert "route_differences" not in said and "sweep_b" not in said
    with pytest.raises(SystemExit):
        repro.main(["--sim", "--out", str(out), "--work", str(work), "--sweeps", "c"])
    assert ran == ["a"]
    # the later call: without --reuse sweep a's table is not taken; with it, a space that differs is refused
    assert repro.main(["--sim", "--out", str(out), "--work", str(work), "--sweeps", "b"]) == 0
    assert "sweep a has no table here yet" in json.loads((out / "reproducibility.json").read_text())["next"]
    assert repro.main(["--sim", "--out", str(out), "--work", str(work), "--sweeps", "b", "--reuse",
                       "--buckets", "1024"]) == 1
    said = json.loads((out / "reproducibility.json").read_text())
    assert said["sweep_a"]["reused"] and "different spaces (buckets: '256,1024' vs '1024')" in said["error"]
    assert ran == ["a", "b", "b"]
    # where the side by side does not fit the lease beside sweep b: it stops there and says how to serve them
    assert repro.main(["--sim", "--out", str(out), "--work", str(work), "--sweeps", "b", "--reuse",
                       "--no-side-by-side"]) == 0
    said = json.loads((out / "reproducibility.json").read_text())
    assert "route_differences" not in said
    assert "both tables are in" in said["next"] and "--sweeps none --reuse --work <a copy of" in said["next"]
    assert "--no-side-by-side" not in said["next"]
    for bad in (["--sweeps", "none"], ["--sweeps", "none", "--reuse", "--no-side-by-side"]):
        with pytest.raises(SystemExit):
            repro.main(["--sim", "--out", str(out), "--work", str(work), *bad])
    assert ran == ["a", "b", "b", "b"]
    # a serve-only call without both tables is an error, not a hint to run a sweep
    (work / "sweep-b" / "routing_table.json").unlink()
    assert repro.main(["--sim", "--out", str(out), "--work", str(work), "--sweeps", "none", "--reuse"]) == 1
    assert "no table of sweep b" in json.loads((out / "reproducibility.json").read_text())["error"]
    assert ran == ["a", "b", "b", "b"]
