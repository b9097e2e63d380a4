"""The host's CPU load beside each real measurement: the share read from ``/proc/stat``, carried by every
round of a bucket into results, and a sweep's warning naming the configs measured on a busy host."""
from __future__ import annotations

import pandas as pd
import pytest

from orchestrator.hostinfo import busy_share, cpu_times, cpu_times_from_stat
from tuning.results import BUSY_HOST_SHARE, busy_host_rows, figure_columns
from tuning.sweep.measure import representative_run
from tuning.sweep.summary import busy_host_line


def test_the_busy_share_between_two_snapshots():
    assert busy_share((100, 1000), (190, 1100)) == pytest.approx(0.9)
    assert busy_share((100, 1000), (100, 1100)) == 0.0
    assert busy_share(None, (1, 2)) is None and busy_share((5, 10), (5, 10)) is None  # no time passed
    # user nice system idle iowait irq softirq steal guest guest_nice: guest (7) is inside user already
    assert cpu_times_from_stat("cpu  100 5 50 800 20 3 2 10 7 0") == (170, 990)
    assert cpu_times_from_stat("cpu0 1 2 3 4 5 6 7 8") is None and cpu_times_from_stat("cpu 1 2 3 4") is None
    assert cpu_times_from_stat("cpu x 2 3 4 5 6") is None
    now = cpu_times()
    assert now is not None and 0 <= now[0] <= now[1]  # this Linux host's own counters
    later = cpu_times()
    assert later[1] >= now[1]


def test_every_round_counts_and_the_busiest_reaches_the_row():
    runs = [{"output_throughput": t, "completed": 8, "failed": 0, "host_cpu_busy": b}
            for t, b in ((900.0, 0.95), (1000.0, 0.2), (1100.0, None))]
    chosen = representative_run(runs)
    assert chosen["output_throughput"] == 1000.0 and chosen["repeat_host_cpu_busy"] == [0.95, 0.2, None]
    assert figure_columns(chosen)["host_cpu_busy_max"] == 0.95  # the busiest round, not the one that stands
    assert figure_columns(representative_run(runs[1:]))["host_cpu_busy_max"] == 0.2
    assert figure_columns({"output_throughput": 1.0, "host_cpu_busy": 0.4})["host_cpu_busy_max"] == 0.4
    assert figure_columns({"output_throughput": 1.0})["host_cpu_busy_max"] is None


def _rows(**busy: float | None) -> pd.DataFrame:
    return pd.DataFrame([{"engine_label": label, "status": "ok", "simulated": False, "host_cpu_busy_max": b}
                         for label, b in busy.items()])


def test_a_sweep_names_the_configs_measured_on_a_busy_host():
    df = _rows(mtp4=0.97, off=0.3, mtp2=None)
    assert list(busy_host_rows(df)["engine_label"]) == ["mtp4"]
    line = busy_host_line(df)
    assert line.startswith("host busy: 1 of 3 measurements") and "up to 97%" in line and line.count("mtp4") == 1
    assert f"{BUSY_HOST_SHARE:.0%}" in line
    assert busy_host_line(_rows(off=0.3)) is None
    simulated = _rows(sim=1.0).assign(simulated=True)  # a simulator's own lag says whether it kept up
    assert busy_host_line(simulated) is None
    failed = _rows(mtp4=1.0).assign(status="failed")
    assert busy_host_line(failed) is None
    assert busy_host_line(pd.DataFrame(columns=["engine_label", "status"])) is None  # results from before


def test_a_simulated_engines_lag_is_its_mean_per_step_over_the_run():
    from tuning.sweep.measure import sim_lag_share

    def counters(lateness_s: float, steps: int) -> dict:  # as /sim/info gives them for one engine
        return {"engine": {"steps": steps, "late_steps": 0, "lateness_s": lateness_s}}

    # 0.5 simulated s behind over 100 steps: 5 ms a step, on a 10-s run: 0.05 %.
    assert sim_lag_share(counters(1.0, 1000), counters(1.5, 1100), 10.0) == pytest.approx(0.0005)
    assert sim_lag_share(counters(1.0, 1000), counters(1.0, 1000), 10.0) is None  # no step ran
    assert sim_lag_share(None, counters(1.0, 10), 10.0) is None
    assert sim_lag_share(counters(0, 1), counters(1, 2), None) is None
    # A closed-loop client's 4 late simulated s over 8 slots of a 10-s run: 5 %, larger than the engine's.
    late = {"engine": {**counters(1.5, 1100)["engine"], "client_lateness_s": 6.0}}
    early = {"engine": {**counters(1.0, 1000)["engine"], "client_lateness_s": 2.0}}
    assert sim_lag_share(early, late, 10.0, 8) == pytest.approx(0.05)
    assert sim_lag_share(early, late, 10.0) == pytest.approx(0.0005)  # no concurrency: the engine's alone
    chosen = representative_run([{"output_throughput": t, "completed": 8, "failed": 0, "sim_lag_share": lag}
                                 for t, lag in ((5.0, 0.03), (6.0, 0.001), (7.0, None))])
    assert figure_columns(chosen)["sim_lag_share_max"] == 0.03


def test_a_sweep_names_the_simulated_configs_that_fell_behind():
    from tuning.results import behind_schedule_rows
    from tuning.sweep.summary import behind_schedule_line

    df = pd.DataFrame([{"engine_label": label, "status": status, "simulated": True, "sim_lag_share_max": lag}
                       for label, status, lag in (("sim-mtp2", "ok", 0.03), ("sim-off", "ok", 0.002),
                                                  ("sim-mtp4", "ok", None), ("sim-mtp3", "failed", 0.5))])
    assert list(behind_schedule_rows(df)["engine_label"]) == ["sim-mtp2"]
    line = behind_schedule_line(df)
    assert line.startswith("behind schedule: 1 of 3 simulated measurements, measured again, still ran") \
        and "up to 3.0%" in line
    assert "--sim-time-scale" in line
    assert behind_schedule_line(df[df["engine_label"] != "sim-mtp2"]) is None
    assert behind_schedule_line(pd.DataFrame(columns=["engine_label", "status"])) is None  # results from before
