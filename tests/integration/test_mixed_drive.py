"""The mixed-workload driver against a served routing table of simulated engines (real Ray, Serve,
router, engines and HTTP): a short load profile with a ramp and a burst, greedy and sampled classes;
the records fall into every phase, the router's cells serve their classes, goodput and throughput per
phase come out, and the report says SIMULATED with each engine's lateness."""
from __future__ import annotations

import pytest

from orchestrator.config import EngineConfig
from tuning.drive import MLPERF_SERVER_SLO, overall_figures, phase_figures, report_lines, run_drive
from tuning.traffic import LoadProfile, TrafficMix

pytest.importorskip("ray")
pytestmark = pytest.mark.timeout(180)

MODEL = "intern-s2-preview-8xh200"
NOSPEC = EngineConfig(backend="sim", model=MODEL, tp=8)
MTP3 = EngineConfig(backend="sim", model=MODEL, tp=8, speculative_algorithm="qwen3_5_mtp", num_draft_tokens=3)
TIME_SCALE = 0.25  # 48-token requests long enough (~1 s) to overlap up to the burst's 10 in flight on a busy host

PROFILE = LoadProfile.model_validate({"phases": [
    {"seconds": 1.0, "concurrency": 2},
    {"seconds": 1.0, "ramp_to": 6},
    {"seconds": 1.5, "concurrency": 10, "name": "burst"},
    {"seconds": 1.0, "concurrency": 2}]})
MIX = TrafficMix.model_validate({"classes": [
    {"max_tokens": 48, "temperature": 0.0, "share": 1},
    {"max_tokens": 48, "temperature": 0.8, "share": 1},
    {"max_tokens": 200, "temperature": 0.0, "share": 1}]})


@pytest.mark.slow  # ~35-55 s on 2 busy cores
def test_drive_a_served_table_through_ramp_and_burst(tmp_path, serve_app, write_sim_table, sim_app_args):
    # Greedy short requests go to MTP-3, sampled short ones to the cell without speculation, long ones
    # to the long bucket (MTP-3 again): two engines.
    table = write_sim_table(tmp_path / "table.json", [("le64", 64, MTP3), ("le256", 256, MTP3)],
                            sweep_id="test-drive", cells={"le64": [("sampled", 1, NOSPEC)]})
    args = sim_app_args(table, tmp_path / "logs", sim_time_scale=TIME_SCALE)
    with serve_app(args, app_name="mixed-drive-test") as base:
        result = run_drive(base, MIX, PROFILE, seed=3, input_len=64, drain_s=60)

    records = result.records
    assert result.simulated and result.time_scale == TIME_SCALE
    assert records and all(r.ok for r in records), [r.error for r in records if not r.ok][:3]
    assert {r.phase for r in records} >= {0, 1, 2}
    # the profile's levels: at most the burst's 10 in flight, and the burst started what it asked for
    starts = sorted((r.started_at, 1) for r in records) + sorted((r.finished_at, -1) for r in records)
    in_flight, peak = 0, 0
    for _, step in sorted(starts, key=lambda e: (e[0], e[1])):
        in_flight += step
        peak = max(peak, in_flight)
    assert 6 <= peak <= 10
    # Launched inside the profile (the dispatcher's decision; the send itself may come a tick later on a
    # busy host, so its time can pass the profile's end by that much).
    assert all(r.phase in range(len(PROFILE.phases)) and r.started_at >= 0 for r in records)
    assert all(r.output_tokens == r.max_tokens for r in records)  # ignore_eos: the class's length
    assert {r.timed_by for r in records} == {"engine stamps"}  # the router passes the simulator's stamps on
    assert all(r.started_at < r.first_token_at <= r.finished_at for r in records)
    # the router's cells: sampled short requests on the engine without speculation, the rest on MTP-3
    routes = {(r.max_tokens, r.temperature): r.route for r in records}
    assert NOSPEC.key() in routes[(48, 0.8)] and MTP3.key() in routes[(48, 0.0)] and MTP3.key() in routes[(200, 0.0)]

    phases = phase_figures(records, PROFILE, MLPERF_SERVER_SLO)
    assert [p.label for p in phases] == ["steady 2", "ramp 2->6", "burst", "steady 2"]
    for p in phases[:3]:
        assert p.started > 0 and 0 < p.goodput <= p.throughput
    overall = overall_figures(records, PROFILE, MLPERF_SERVER_SLO)
    assert overall.started == len(records) and overall.failed == 0
    assert overall.throughput == pytest.approx(sum(p.throughput * (p.end - p.start) for p in phases) / PROFILE.seconds)

    assert {e.engine for e in result.lateness} == {MTP3.key(), NOSPEC.key()}
    assert all(e.steps > 0 for e in result.lateness)
    text = "\n".join(report_lines(result, MLPERF_SERVER_SLO))
    assert "SIMULATED mixed-workload drive" in text and "simulated s" in text and "burst" in text
