"""The mixed-payoff benchmark's pure parts (:mod:`tuning.payoff`, what ``benchmarks/mixed_payoff.py``
reports): each class's share of a drive's goodput, the table against the best single config round by round,
and the report's labels for real engines."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuning import payoff

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
TABLE = RESULTS / "mixed_payoff_sim_2026-12-01_table.json"  # the benchmark's default table and mix
MIX = RESULTS / "mixed_payoff_sim_2026-12-01_mix.yaml"


def _drive(app, rnd, classes, kept=True):
    total = sum(classes)
    return {"mix": "stated", "round": rnd, "app": app, "kept_schedule": kept, "classes": classes,
            "overall": {"goodput": total, "throughput": total}, "phases": [{"label": "steady", "goodput": total, "throughput": total}]}


def test_class_goodputs_split_the_drives_goodput():
    from tuning.drive import MLPERF_SERVER_SLO, DriveRecord, overall_figures
    from tuning.traffic import LoadProfile

    profile = LoadProfile.model_validate({"phases": [{"seconds": 10, "concurrency": 4}]})
    records = [DriveRecord(index=i, phase=0, class_index=i % 3, max_tokens=64, temperature=0.0, prompt_len=32, started_at=i * 0.5,
                           first_token_at=i * 0.5 + 0.1, finished_at=i * 0.5 + 1.0 + (i % 2), output_tokens=64, ok=i != 4)
               for i in range(12)]
    parts = payoff.class_goodputs(records, profile, MLPERF_SERVER_SLO, 3)
    assert len(parts) == 3 and all(p > 0 for p in parts)
    assert sum(parts) == pytest.approx(overall_figures(records, profile, MLPERF_SERVER_SLO).goodput)


def test_the_table_is_reported_against_the_best_single_round_by_round():
    drives = [_drive("table", 0, [10.0, 30.0]), _drive("single-a", 0, [12.0, 20.0]), _drive("single-b", 0, [5.0, 28.0]),
              _drive("table", 1, [11.0, 27.0]), _drive("single-a", 1, [10.0, 22.0]), _drive("single-b", 1, [6.0, 30.0])]
    s = payoff.summarize(drives, ["table", "single-a", "single-b"])["stated"]
    assert s["best_single"] == "single-b"
    assert s["ratio table / best single"]["values"] == pytest.approx([40 / 33, 38 / 36], abs=1e-4)
    md = payoff.render_markdown({"summary": {"stated": s}, "slo": {"ttft_s": 2.0, "tpot_s": 0.08}, "simulated": False})
    assert "table / best single" in md and "(measured)" in md and "simulated time" not in md


def test_the_cap_is_chosen_from_each_part_driven_alone_and_reported_beside_the_table():
    from orchestrator import table as routing
    from tuning.traffic import load_mix

    table_data = json.loads(TABLE.read_text())
    table = routing.parse(table_data)
    keys = sorted(table.distinct_configs())
    mix = load_mix(MIX)
    drives: list[tuple[str, str]] = []

    def goodput(best_greedy: str):
        def part_goodput(app: str, part_mix, label: str) -> float | None:
            drives.append((app, label))
            assert {table.band_for(part_mix.temperature_of(c)).name for c in part_mix.classes} == {label.split("/")[1]}
            fast = (app == f"single-{best_greedy}") == label.endswith("/greedy")
            return 300.0 if fast else 200.0
        return part_goodput

    singles = {f"single-{k}": k for k in keys[:2]}
    cap = payoff.measure_cap(table_data, mix, singles, 2, goodput(keys[0]), {k: c.to_dict() for k, c in table.distinct_configs().items()})
    parts = {(p["bucket"], p["band"]) for p in cap["parts"]}
    assert parts == set(mix.cell_shares(table, by="tokens")) and len(drives) == 2 * len(parts)
    assert cap["app"] == "cap" and all(p["rates"] for p in cap["parts"])
    served = routing.parse(cap["table"])
    for p in cap["parts"]:
        b = served.bucket(p["bucket"])
        cell = b.cell_for(p["band"], 1)
        assert (cell.engine_config() if cell else b.engine_config()).key() == p["route"]
    assert {p["route"] for p in cap["parts"] if p["band"] == "greedy"} == {keys[0]}

    # one config fastest everywhere: that single's app is the cap
    alone = payoff.measure_cap(table_data, mix, singles, 2, lambda app, m, label: 300.0 if app.endswith(keys[1]) else 100.0, {})
    assert alone["app"] == f"single-{keys[1]}" and "table" not in alone
    # a part whose drives all fell behind: no cap, and the record says why
    behind = payoff.measure_cap(table_data, mix, singles, 2, lambda app, m, label: None if "sampled" in label else 1.0, {})
    assert "app" not in behind and "sampled" in behind["error"]

    drives_ = [_drive("table", 0, [40.0]), _drive("cap", 0, [44.0]), _drive("single-a", 0, [30.0]),
               _drive("table", 1, [42.0]), _drive("cap", 1, [42.0]), _drive("single-a", 1, [33.0])]
    s = payoff.summarize(drives_, ["table", "cap", "single-a"], "cap")["stated"]
    assert s["cap"] == "cap" and s["ratio table / cap"]["values"] == pytest.approx([40 / 44, 1.0], abs=1e-4)
    md = payoff.render_markdown({"summary": {"stated": s}, "slo": {"ttft_s": 2.0, "tpot_s": 0.08}, "simulated": True,
                                 "cap": {**cap, "seconds": 30, "in_flight": 64}})
    assert "**ratio table / cap** (cap)" in md and "The cap:" in md and keys[0] in md


def test_every_app_fits_one_gpu_at_a_lower_memory_fraction_and_the_reservation_is_counted():
    from orchestrator import table as routing

    cfg = {"backend": "pytorch", "model": "/m", "tp": 1, "memory_fraction": 0.8, "max_batch_size": 64}
    mtp = {**cfg, "speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": 4}
    data = {"schema_version": 2, "provenance": {"model": "/m", "gpu_type": "H200", "gpu_count": 1, "engine_versions": {},
                                                 "sweep_id": "s", "created_at": "now", "simulated": False},
            "buckets": [{"name": "le1024", "max_output_len": 1024, "config": mtp, "figures": {"output_throughput": 1.0},
                         "cells": [{"sampling": "sampled", "min_in_flight": 1, "config": cfg,
                                    "figures": {"output_throughput": 1.0}}]}]}
    table = routing.parse(data)
    apps = {"table": (data, {k: 1 for k in table.distinct_configs()})}
    assert payoff.gpus_reserved(apps, share_gpu=True) == pytest.approx(1.8)  # two engines at 0.8 + 0.1: no room
    low = payoff.with_memory_fraction(data, 0.02)
    assert data["buckets"][0]["config"]["memory_fraction"] == 0.8  # the input is left as it was
    moved = routing.parse(low).distinct_configs()
    assert {c.memory_fraction for c in moved.values()} == {0.02} and len(moved) == 2
    apps = {"table": (low, {k: 1 for k in moved}), **{f"single-{k}": (low, {k: 2}) for k in moved}}
    assert payoff.gpus_reserved(apps, share_gpu=True, cap_engines=2) == pytest.approx(8 * 0.12)
    with pytest.raises(SystemExit, match="between 0 and 1"):
        payoff.with_memory_fraction(data, 1.5)
    # a planned table's replicas follow its configs to their new engine keys
    keys = {c.num_draft_tokens or 0: k for k, c in table.distinct_configs().items()}
    planned = json.loads(json.dumps(data))
    planned["provenance"]["gpu_budget"] = {"gpus": 1, "share_gpu": True, "replicas": {keys[4]: 2, keys[0]: 1}}
    moved_plan = routing.parse(payoff.with_memory_fraction(planned, 0.02))
    new_keys = {c.num_draft_tokens or 0: k for k, c in moved_plan.distinct_configs().items()}
    assert moved_plan.provenance.gpu_budget.replicas == {new_keys[4]: 2, new_keys[0]: 1}
    assert set(new_keys.values()).isdisjoint(keys.values())


def test_when_the_best_routing_is_the_tables_own_the_table_is_the_cap():
    """A table whose cells already send each part to its fastest config, on the replicas the cap would
    size: no second app of the same engines is deployed; the table stands for the cap. A table that
    routes a part elsewhere at some load is not the cap's routing."""
    from orchestrator import table as routing
    from orchestrator.config import EngineConfig
    from tuning.traffic import TrafficMix

    greedy_fast = EngineConfig(backend="sim", model="intern-s2-preview-8xh200", tp=8, speculative_algorithm="qwen3_5_mtp",
                               num_draft_tokens=3)
    sampled_fast = EngineConfig(backend="sim", model="intern-s2-preview-8xh200", tp=8)
    a, b = greedy_fast.key(), sampled_fast.key()

    def table_data(min_in_flight: int) -> dict:
        return {"schema_version": 2, "provenance": {"model": "m", "gpu_type": "none (simulated)", "gpu_count": 0,
                                                     "sweep_id": "s", "created_at": "now", "simulated": True},
                "buckets": [{"name": "le1024", "max_output_len": 1024, "config": greedy_fast.to_dict(),
                             "figures": {"output_throughput": 1.0},
                             "cells": [{"sampling": "sampled", "min_in_flight": min_in_flight,
                                        "config": sampled_fast.to_dict(), "figures": {"output_throughput": 1.0}}]}]}

    mix = TrafficMix.model_validate({"classes": [{"max_tokens": 1024, "temperature": 0.0, "share": 1},
                                                 {"max_tokens": 1024, "temperature": 0.8, "share": 1}]})
    singles = {f"single-{a}": a, f"single-{b}": b}

    def goodput(app: str, part_mix, label: str) -> float:  # each config 3x the other on its own part
        return 600.0 if (app == f"single-{a}") == label.endswith("/greedy") else 200.0

    both = {a: 1, b: 1}
    own = payoff.measure_cap(table_data(1), mix, singles, 2, goodput, {}, both)
    assert own["app"] == "table" and "table" not in own and own["replicas"] == both
    assert {(p["band"], p["route"]) for p in own["parts"]} == {("greedy", a), ("sampled", b)}
    # Sampled requests stay on the greedy config below 8 in flight: not the cap's routing, so a cap app.
    configs = {k: c.to_dict() for k, c in routing.parse(table_data(8)).distinct_configs().items()}
    loaded = payoff.measure_cap(table_data(8), mix, singles, 2, goodput, configs, both)
    assert loaded["app"] == "cap" and routing.parse(loaded["table"]).bucket("le1024").cell_for("sampled", 1) is not None
    assert payoff.measure_cap(table_data(1), mix, singles, 2, goodput, configs, {a: 2, b: 1})["app"] == "cap"
