"""Fitting engines onto GPUs: the one packing rule (``orchestrator.config.gpus_needed``), deploy's
refusal of an app that cannot be placed, and the sweep's choice of a table that fits ``--serve-gpus``
(pure: hand-made results, no Ray)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from orchestrator import table as routing
from orchestrator.config import EngineConfig, gpus_needed
from orchestrator.errors import ConfigError
from orchestrator.table import GpuBudget, Provenance
from tuning.buckets import make_buckets
from tuning.choose.pick import IncompleteResultsError, pick_best
from tuning.results import results_frame, rows_for_trial
from tuning.sweep.space import ROLE_MTP_OFF, ROLE_SEARCH, ROLE_STATIC


# ----- the packing rule ----------------------------------------------------------------------------------
def test_whole_requests_take_whole_gpus_and_fractions_share_them():
    assert gpus_needed([]) == 0
    assert gpus_needed([0, 0]) == 0  # simulated engines
    assert gpus_needed([1, 2, 8]) == 11
    assert gpus_needed([0.35, 0.6]) == 1
    assert gpus_needed([0.7, 0.2, 0.1]) == 1  # exact in Ray's 1/10,000 units, not in floats
    assert gpus_needed([0.35, 0.9]) == 2  # the H200 table: 1.25 GPUs by sum, two GPUs placed
    # A fractional request never shares a GPU with a whole one.
    assert gpus_needed([1, 0.5, 0.5]) == 2
    assert gpus_needed([2, 0.3]) == 3


def test_fractions_do_not_span_gpus_so_a_sum_is_not_enough():
    assert sum([0.6] * 3) <= 2
    assert gpus_needed([0.6] * 3) == 3
    # First-fit decreasing: the large ones first, the small ones fill the gaps.
    assert gpus_needed([0.2, 0.7, 0.3, 0.8]) == 2


def test_a_request_above_one_gpu_must_be_whole():
    with pytest.raises(ValueError, match="whole number"):
        gpus_needed([1.5])
    with pytest.raises(ValueError, match=">= 0"):
        gpus_needed([-0.1])


# ----- deploy: a table whose replicas cannot be placed is refused up front -----------------------------
def _mtp(drafts: int, mem: float, tp: int = 1) -> EngineConfig:
    return EngineConfig(model="/ckpt", tp=tp, speculative_algorithm="qwen3_5_mtp", num_draft_tokens=drafts,
                        memory_fraction=mem)


def _app(path: Path, **args):
    from orchestrator.serve.app import AppArgs, load_table

    app_args = AppArgs.parse({"routing_table": str(path), **args})
    return app_args, load_table(app_args)


def test_deploy_check_places_shared_replicas_instead_of_summing_them(tmp_path, write_table):
    from orchestrator.serve.app import check_resources, gpu_requests

    path = write_table(tmp_path / "t.json", [_mtp(1, 0.5), _mtp(2, 0.5), _mtp(3, 0.5)])  # 0.6 GPU each
    args, table = _app(path, engine={"share_gpu": True})
    assert gpu_requests(args, table) == pytest.approx([0.6] * 3)
    with pytest.raises(ConfigError, match=r"reserves 1\.8 GPUs .*, 3 once placed .* cluster has 2") as e:
        check_resources(args, table, {"GPU": 2, "CPU": 16})
    assert "--share-gpu" not in str(e.value)  # it is on already
    assert "--serve-gpus" in str(e.value)
    check_resources(args, table, {"GPU": 3, "CPU": 16})


def test_deploy_check_counts_every_minimum_replica(tmp_path, write_table):
    from orchestrator.serve.app import check_resources, gpu_requests

    path = write_table(tmp_path / "t.json", [_mtp(1, 0.25), _mtp(4, 0.5)])  # 0.35 and 0.6 shared
    args, table = _app(path, engine={"share_gpu": True}, scaling={"le1024": {"min_replicas": 2, "max_replicas": 4}})
    assert sorted(gpu_requests(args, table)) == pytest.approx([0.35, 0.6, 0.6])
    with pytest.raises(ConfigError, match="1.55 GPUs"):
        check_resources(args, table, {"GPU": 1, "CPU": 16})
    check_resources(args, table, {"GPU": 2, "CPU": 16})
    one, _ = _app(path, engine={"share_gpu": True})
    check_resources(one, table, {"GPU": 1, "CPU": 16})  # one replica each: 0.95 of a GPU


def test_deploy_check_suggests_sharing_only_when_it_is_off_and_could_help(tmp_path, write_table):
    from orchestrator.serve.app import check_resources

    args, table = _app(write_table(tmp_path / "t.json", [_mtp(1, 0.25), _mtp(4, 0.5)]))
    with pytest.raises(ConfigError, match=r"reserves 2 GPUs .* cluster has 1: .*--share-gpu"):
        check_resources(args, table, {"GPU": 1, "CPU": 16})
    args, table = _app(write_table(tmp_path / "tp2.json", [_mtp(1, 0.25, tp=2)]), engine={"share_gpu": True})
    with pytest.raises(ConfigError, match="cluster has 1") as e:
        check_resources(args, table, {"GPU": 1, "CPU": 16})
    assert "--share-gpu" not in str(e.value)
    with pytest.raises(ConfigError, match="reserves 2 CPUs .* cluster has 1"):
        check_resources(args, table, {"GPU": 2, "CPU": 1})


# ----- the sweep's choice under --serve-gpus -------------------------------------------------------------
BUCKETS = make_buckets((1024, 16384), concurrency_levels=(64, 128), num_prompts=64)
PROV = Provenance(model="/ckpt", gpu_type="NVIDIA H200", gpu_count=1, sweep_id="t",
                  created_at="2026-11-29T00:00:00+00:00", simulated=False)
OFF, STATIC = EngineConfig(model="/ckpt", memory_fraction=0.8), _mtp(4, 0.8)  # 0.9 of a GPU shared each


def _bench(tput: float) -> dict:
    lat = {"mean": 10.0, "median": 10.0, "p99": 20.0}
    return {"output_throughput": tput, "request_throughput": 1.0, "completed": 64, "failed": 0,
            "failure_reasons": {}, "ttft_ms": lat, "tpot_ms": lat, "itl_ms": lat, "e2e_ms": lat,
            "accept_length": 2.0, "simulated": False}


def _frame(*trials: tuple[str, EngineConfig, tuple[float, float, float, float]]) -> pd.DataFrame:
    """trials: (role, config, throughput at le1024@64, le1024@128, le16384@64, le16384@128)."""
    rows = []
    for i, (role, cfg, tputs) in enumerate(trials):
        points = [("le1024", 64), ("le1024", 128), ("le16384", 64), ("le16384", 128)]
        rows += rows_for_trial(sweep_id="t", trial_id=f"t{i}", role=role, config=cfg, buckets=BUCKETS,
                               measurements={p: _bench(t) for p, t in zip(points, tputs)})
    return results_frame(rows)


BASELINES = ((ROLE_MTP_OFF, OFF, (5000, 5000, 5000, 5000)), (ROLE_STATIC, STATIC, (7000, 5000, 16000, 5000)))
A, B, C = _mtp(1, 0.25), _mtp(4, 0.6), _mtp(3, 0.3)  # shared: 0.35, 0.7, 0.4 of a GPU


def _labels(table) -> list[str]:
    return [b.engine_config().label() for b in table.buckets]


def test_a_best_table_that_fits_is_unchanged():
    df = _frame(*BASELINES, (ROLE_SEARCH, A, (9000, 9000, 5000, 5000)), (ROLE_SEARCH, B, (6000, 6000, 20000, 20000)))
    free = pick_best(df, BUCKETS, provenance=PROV)
    fitted = pick_best(df, BUCKETS, provenance=PROV, budget=GpuBudget(gpus=2, share_gpu=True))
    assert fitted.buckets == free.buckets
    assert fitted.provenance.gpu_budget == GpuBudget(gpus=2, share_gpu=True, notes=())
    assert free.provenance.gpu_budget is None
    # A table chosen without a budget is written as before the field existed.
    assert "gpu_budget" not in json.loads(free.to_json())["provenance"]
    assert routing.parse(fitted.to_json()) == fitted


def test_a_best_table_that_does_not_fit_gives_way_to_the_best_fitting_mix():
    df = _frame(*BASELINES, (ROLE_SEARCH, A, (9000, 9000, 5000, 5000)), (ROLE_SEARCH, B, (6000, 6000, 20000, 20000)),
                (ROLE_SEARCH, C, (8000, 8000, 15000, 15000)))
    assert _labels(pick_best(df, BUCKETS, provenance=PROV)) == [A.label(), B.label()]  # 0.35 + 0.7: 2 GPUs
    table = pick_best(df, BUCKETS, provenance=PROV, budget=GpuBudget(gpus=1, share_gpu=True))
    # A + C (0.75 of a GPU): 9000 x 15000 beats C alone (8000 x 15000), B alone (6000 x 20000) and the
    # static baseline alone (7000 x 16000).
    assert _labels(table) == [A.label(), C.label()]
    assert table.gpus_needed(share_gpu=True) == 1
    notes = table.provenance.gpu_budget.notes
    assert "needs 2 GPUs, over the budget of 1" in notes[0]
    assert any(n.startswith(f"le16384: {C.label()} (15,000 tok/s) instead of {B.label()}") and "-25.0%" in n
               for n in notes)
    # Not shared, one GPU holds one engine: the best single config for both buckets.
    assert _labels(pick_best(df, BUCKETS, provenance=PROV, budget=GpuBudget(gpus=1))) == [C.label(), C.label()]


def test_equal_objectives_prefer_fewer_engines():
    x, y = _mtp(4, 0.6), _mtp(5, 0.6)  # each bucket's best, 0.7 + 0.7 shared: 2 GPUs
    p, q, r = _mtp(2, 0.5), _mtp(1, 0.35), _mtp(3, 0.35)  # 0.6, 0.45, 0.45: p + q or p + r do not fit
    df = _frame(*BASELINES, (ROLE_SEARCH, x, (20000, 20000, 1000, 1000)), (ROLE_SEARCH, y, (1000, 1000, 20000, 20000)),
                (ROLE_SEARCH, p, (16000, 16000, 9000, 9000)), (ROLE_SEARCH, q, (9000, 9000, 1000, 1000)),
                (ROLE_SEARCH, r, (1000, 1000, 16000, 16000)))
    table = pick_best(df, BUCKETS, provenance=PROV, budget=GpuBudget(gpus=1, share_gpu=True))
    assert _labels(table) == [p.label(), p.label()]  # 16000 x 9000, as q + r, with one engine


def test_nothing_fits_raises_and_keeps_the_previous_table(tmp_path):
    two = [(role, cfg.replace(tp=2), t) for role, cfg, t in BASELINES]
    df = _frame(*two, (ROLE_SEARCH, A.replace(tp=2), (9000, 9000, 5000, 5000)))
    path = tmp_path / "routing_table.json"
    routing.commit(pick_best(df, BUCKETS, provenance=PROV), path)
    before = path.read_text()
    with pytest.raises(IncompleteResultsError, match=r"fits 1 GPU\(s\)") as e:
        routing.commit(pick_best(df, BUCKETS, provenance=PROV, budget=GpuBudget(gpus=1)), path)
    for said in ("previous table is kept", "the best config per bucket needs 4 GPUs", "Raise --serve-gpus"):
        assert said in str(e.value)
    assert path.read_text() == before


def test_load_cells_that_do_not_fit_are_dropped_least_gain_first_and_said_so():
    big, small = _mtp(2, 0.8), _mtp(3, 0.4)  # 0.9 and 0.5 of a GPU shared
    df = _frame(*BASELINES,
                # A serves both buckets at their primary load; at 128 in flight others win.
                (ROLE_SEARCH, A, (30000, 9000, 30000, 9000)),
                (ROLE_SEARCH, big, (1000, 12000, 1000, 12000)),
                (ROLE_SEARCH, small, (1000, 10000, 1000, 11000)))
    free = pick_best(df, BUCKETS, provenance=PROV)
    assert [[(c.sampling, c.min_in_flight, c.engine_config().label()) for c in b.cells] for b in free.buckets] == \
        [[(None, 128, big.label())]] * 2  # measured at one temperature: a load cell of every band
    table = pick_best(df, BUCKETS, provenance=PROV, budget=GpuBudget(gpus=1, share_gpu=True))
    assert _labels(table) == [A.label(), A.label()]
    # A (0.35) and big (0.9) do not fit one GPU: both load cells go, and the notes say which and why.
    assert [b.cells for b in table.buckets] == [(), ()]
    notes = table.provenance.gpu_budget.notes
    for bucket in ("le1024", "le16384"):
        assert any(n.startswith(f"{bucket} cell any@128: {big.label()} does not fit 1") for n in notes), notes
    assert table.gpus_needed(share_gpu=True) == 1


# ----- the sweep's flag ----------------------------------------------------------------------------------
def test_serve_gpus_flag_reaches_the_spec_the_choice_and_a_resume(tmp_path, model_dir):
    from tuning.sweep import SweepSpec, _parser, build_spec, resumed_spec, serving_line

    model = str(model_dir)
    args = _parser().parse_args(["--model", model, "--tp", "1", "--share-gpu", "--serve-gpus", "1",
                                 "--run-dir", str(tmp_path / "r")])
    spec = build_spec(args, cluster_gpus=1)
    assert spec.serve_gpus == 1 and spec.gpu_budget() == GpuBudget(gpus=1, share_gpu=True)
    assert SweepSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    plain = build_spec(_parser().parse_args(["--model", model, "--tp", "1", "--run-dir", str(tmp_path / "r")]),
                       cluster_gpus=1)
    assert plain.serve_gpus is None and plain.gpu_budget() is None  # default: no limit

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    old = {k: v for k, v in spec.to_dict().items() if k != "serve_gpus"}  # a sweep.json from before the flag
    (run_dir / "sweep.json").write_text(json.dumps(old))
    assert resumed_spec(run_dir).serve_gpus is None
    assert resumed_spec(run_dir, serve_gpus=2).gpu_budget() == GpuBudget(gpus=2, share_gpu=True)

    with pytest.raises(ConfigError, match="tp=2"):
        build_spec(_parser().parse_args(["--model", model, "--tp", "2", "--serve-gpus", "1",
                                         "--run-dir", str(tmp_path / "r2")]), cluster_gpus=2)

    df = _frame(*BASELINES, (ROLE_SEARCH, A, (9000, 9000, 5000, 5000)), (ROLE_SEARCH, B, (6000, 6000, 20000, 20000)))
    table = pick_best(df, BUCKETS, provenance=PROV)
    assert "need 2 GPU(s); 2 with --share-gpu" in serving_line(table, plain)
    assert "need 2 GPU(s); 1 with --share-gpu" in serving_line(table.model_copy(update={"buckets": (
        table.buckets[0], table.buckets[1].model_copy(update={"config": C.to_dict()}))}), plain)


def test_an_update_must_place_its_new_engines_beside_the_running_ones(tmp_path, write_table):
    """Until the router switches, the running engines keep their GPUs; the new ones go where room is left."""
    from orchestrator.serve.app import RunningEngine, check_resources

    args, table = _app(write_table(tmp_path / "new.json", [_mtp(3, 0.5), _mtp(4, 0.5)]), engine={"share_gpu": True})
    cluster = {"GPU": 2, "CPU": 16}
    check_resources(args, table, cluster)  # the new table alone fits 2 GPUs (0.6 + 0.6 on two)
    # 0.4 + 0.4 running on one GPU leave 0.2 there and one free GPU: only one new 0.6 replica fits.
    running = {c.key(): RunningEngine(c) for c in (_mtp(1, 0.3), _mtp(2, 0.3))}
    assert gpus_needed([0.6, 0.6, 0.4, 0.4]) == 2  # a packing from scratch would say it fits
    with pytest.raises(ConfigError, match=r"updating starts the new engines .* running ones .* takes 3 GPUs"
                                          r" .*cluster has 2") as e:
        check_resources(args, table, cluster, running=running)
    assert all(k in str(e.value) for k in running)
    check_resources(args, table, {"GPU": 3, "CPU": 16}, running=running)
    # Replicas autoscaled above the minimum hold GPUs too.
    one = {_mtp(1, 0.3).key(): RunningEngine(_mtp(1, 0.3), replicas=1)}
    check_resources(args, table, {"GPU": 2, "CPU": 16}, running=one)  # 0.4 | 0.6 + 0.6 -> GPU0: 0.4+0.6, GPU1: 0.6
    with pytest.raises(ConfigError, match="takes 3 GPUs"):
        check_resources(args, table, {"GPU": 2, "CPU": 16},
                        running={k: RunningEngine(r.config, replicas=3) for k, r in one.items()})
    # Engines kept from the old table are not started again: nothing new, nothing to place.
    kept = {c.key(): RunningEngine(c) for c in (_mtp(3, 0.5), _mtp(4, 0.5))}
    check_resources(args, table, cluster, running=kept)


def test_new_apps_must_fit_what_is_free_not_only_the_cluster():
    """``check_free``: the apps' reservations summed against what running apps and jobs leave free."""
    from orchestrator.errors import ConfigError
    from orchestrator.serve.app import check_free

    check_free([{"CPU": 1.0, "GPU": 0.5}, {"CPU": 1.0, "GPU": 0.5}], {"CPU": 2.0, "GPU": 1.0})
    with pytest.raises(ConfigError, match=r"the 2 apps together reserve 2 CPU\(s\) and 1 GPU\(s\) but only 1\.5 CPU"):
        check_free([{"CPU": 1.0, "GPU": 0.5}] * 2, {"CPU": 1.5, "GPU": 1.0}, what="the 2 apps together")
    with pytest.raises(ConfigError, match=r"the app reserves 0 CPU\(s\) and 0\.16 GPU\(s\) but only 0 CPU\(s\) and 0\.1 GPU"):
        check_free([{"CPU": 0.0, "GPU": 0.16}], {"GPU": 0.1})
