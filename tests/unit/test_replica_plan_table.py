"""The sweep's table under --serve-gpus with cells: whole replicas planned on the GPUs, a cell that does
not pay for its replica gives way, the plan is written into the table, and deploy runs those replicas
unless its own scaling says otherwise."""
from __future__ import annotations

import pandas as pd
import pytest

from orchestrator import table as routing
from orchestrator.config import EngineConfig
from orchestrator.table import GpuBudget, Provenance
from tuning.buckets import make_buckets
from tuning.choose.pick import pick_best
from tuning.choose.plan import plan_replicas
from tuning.results import results_frame, rows_for_trial
from tuning.sweep.space import ROLE_MTP_OFF, ROLE_SEARCH, ROLE_STATIC
from tuning.traffic import TrafficMix

BUCKETS = make_buckets((1024,), concurrency_levels=(64,), temperatures=(0.0, 0.8), num_prompts=64)
PROV = Provenance(model="/ckpt", gpu_type="NVIDIA H200", gpu_count=8, sweep_id="t",
                  created_at="2026-12-01T00:00:00+00:00", simulated=False)
OFF = EngineConfig(model="/ckpt", tp=8, memory_fraction=0.9)
MTP3 = EngineConfig(model="/ckpt", tp=8, memory_fraction=0.9, speculative_algorithm="qwen3_5_mtp", num_draft_tokens=3)
MTP4 = EngineConfig(model="/ckpt", tp=8, memory_fraction=0.8, speculative_algorithm="qwen3_5_mtp", num_draft_tokens=4)
HALF = TrafficMix.model_validate({"classes": [{"max_tokens": 1024, "temperature": 0.0, "share": 1},
                                              {"max_tokens": 1024, "temperature": 0.8, "share": 1}]})


def _bench(tput: float) -> dict:
    lat = {"mean": 10.0, "median": 10.0, "p99": 20.0}
    return {"output_throughput": tput, "request_throughput": tput / 1024, "completed": 64, "failed": 0,
            "failure_reasons": {}, "ttft_ms": lat, "tpot_ms": lat, "itl_ms": lat, "e2e_ms": lat,
            "accept_length": 2.0, "simulated": False}


def _frame() -> pd.DataFrame:
    """MTP-3 best greedy (1,000 vs 800 tok/s), MTP off best sampled (1,000 vs 500): a sampled cell."""
    b = BUCKETS[0]
    rows = []
    for i, (role, cfg, greedy, sampled) in enumerate([(ROLE_MTP_OFF, OFF, 800, 1000), (ROLE_STATIC, MTP4, 900, 400),
                                                      (ROLE_SEARCH, MTP3, 1000, 500)]):
        rows += rows_for_trial(sweep_id="t", trial_id=f"t{i}", role=role, config=cfg, buckets=BUCKETS,
                               measurements={b.measurement_key(64, 0.0): _bench(greedy),
                                             b.measurement_key(64, 0.8): _bench(sampled)})
    return results_frame(rows)


def _table(gpus: int, traffic=HALF):
    df = _frame()
    table = pick_best(df, BUCKETS, provenance=PROV, budget=GpuBudget(gpus=gpus))
    assert table.buckets[0].engine_config().key() == MTP3.key()
    assert [c.engine_config().key() for c in table.buckets[0].cells] == [OFF.key()]  # as chosen per replica
    return plan_replicas(table, df, BUCKETS, traffic)


def test_on_four_engines_the_cell_pays_and_each_config_gets_two_replicas():
    table = _table(32)
    budget = table.provenance.gpu_budget
    assert budget.replicas == {MTP3.key(): 2, OFF.key(): 2}
    assert [c.engine_config().key() for c in table.buckets[0].cells] == [OFF.key()]
    assert "replicas planned on 32 GPU(s) for the traffic mix" in budget.notes[0] and "4,000 tok/s" in budget.notes[0] and "3,556" in budget.notes[0]


def test_on_three_engines_the_cell_does_not_pay_for_its_replica_and_one_config_serves_all():
    table = _table(24)
    b = table.buckets[0]
    assert table.provenance.gpu_budget.replicas == {OFF.key(): 3}
    assert b.engine_config().key() == OFF.key() and b.cells == ()
    assert b.figures.output_throughput == pytest.approx(800)  # its own greedy figures, not MTP-3's
    assert b.gains["mtp_off"] == pytest.approx(0.0) and b.gains["static"] == pytest.approx(800 / 900 - 1)


def test_on_one_engine_the_plans_notes_supersede_the_fitting_steps_dropped_cell():
    """One tp-8 engine: fitting the table as chosen (MTP-3 + an MTP-off cell) to 8 GPUs drops the cell
    and says so; the plan then puts MTP off on the one replica for everything (the best single config
    on the half-sampled mix). The table's notes say what the plan serves, not a drop it made moot."""
    df = _frame()
    fitted = pick_best(df, BUCKETS, provenance=PROV, budget=GpuBudget(gpus=8))
    assert fitted.buckets[0].cells == ()
    assert [n for n in fitted.provenance.gpu_budget.notes if n.endswith("GPU(s); dropped")]
    budget = plan_replicas(fitted, df, BUCKETS, HALF).provenance.gpu_budget
    assert budget.replicas == {OFF.key(): 1}
    assert "replicas planned on 8 GPU(s)" in budget.notes[0]
    assert not [n for n in budget.notes if n.endswith("GPU(s); dropped")], budget.notes


def test_without_a_traffic_mix_the_measured_bands_count_alike():
    assert _table(32, traffic=None).provenance.gpu_budget.replicas == {MTP3.key(): 2, OFF.key(): 2}
    assert "the buckets' workloads in proportion, greedy/sampled alike" in \
        _table(32, traffic=None).provenance.gpu_budget.notes[0]


def test_deploy_runs_the_planned_replicas_unless_its_scaling_says_otherwise(tmp_path):
    from orchestrator.serve.app import AppArgs, gpu_requests, load_table

    path = tmp_path / "t.json"
    routing.commit(_table(32), path)
    assert routing.load(path).provenance.gpu_budget.replicas == {MTP3.key(): 2, OFF.key(): 2}  # round trip

    def requests(**args):
        app_args = AppArgs.parse({"routing_table": str(path), **args})
        return gpu_requests(app_args, load_table(app_args))

    assert requests() == [8, 8, 8, 8]
    assert requests(scaling={"default": {"num_replicas": 1}}) == [8, 8]
    assert sorted(requests(scaling={MTP3.key(): {"num_replicas": 3}})) == [8] * 5


def test_a_table_written_without_a_plan_stays_as_it_was():
    data = routing.parse(_table(32).model_dump(mode="json")).model_dump(mode="json")
    budget = {**data["provenance"]["gpu_budget"]}
    budget.pop("replicas")
    data["provenance"]["gpu_budget"] = budget
    table = routing.parse(data)
    assert table.provenance.gpu_budget.replicas == {}
    assert "replicas" not in table.model_dump(mode="json")["provenance"]["gpu_budget"]
    with pytest.raises(ValueError, match="whole numbers"):
        GpuBudget(gpus=8, replicas={"k": 0})
