"""tuning.schedule: vLLM's draft length per batch size from the sweep's load cells."""
from __future__ import annotations

import pytest

from orchestrator.errors import ConfigError
from tuning.schedule import DraftSchedule, LoadPoint, draft_schedule, load_points


def _points(table: dict[int, dict[int, float]], spread: float = 0.0) -> list[LoadPoint]:
    return [LoadPoint(c, k, t, spread) for c, row in table.items() for k, t in row.items()]


def test_speculate_at_low_load_and_turn_off_at_high_load() -> None:
    measured = {1: {0: 100, 2: 170, 4: 190}, 16: {0: 1000, 2: 1300, 4: 1250},
                64: {0: 3000, 2: 2990, 4: 2500}, 256: {0: 6000, 2: 5000, 4: 4000}}
    s = draft_schedule(_points(measured), max_batch_size=512)
    # 1: 4 is best; 16: 2 (4 is 3.8 % below); 64: 0 and 2 tie, 2 kept from its neighbour; 256: off
    assert s.ranges == ((1, 4, 4), (5, 128, 2), (129, 512, 0))
    assert s.num_speculative_tokens == 4
    assert s.to_vllm() == [[1, 4, 4], [5, 128, 2], [129, 512, 0]]
    assert [s.draft_tokens_at(b) for b in (1, 4, 5, 128, 129, 1000)] == [4, 4, 2, 2, 0, 0]


def test_neighbours_within_noise_merge_into_one_range() -> None:
    measured = {1: {2: 200, 3: 204}, 8: {2: 800, 3: 790}, 32: {2: 2000, 3: 2050}}
    assert draft_schedule(_points(measured)).ranges == ((1, 32, 3),)  # 3 stays as good everywhere
    # with a wider run-to-run spread, a 5 % gap is noise too
    wider = {1: {2: 200, 3: 210}, 8: {2: 800, 3: 760}}
    assert draft_schedule(_points(wider)).ranges == ((1, 2, 3), (3, 8, 2))
    assert draft_schedule(_points(wider, spread=0.06)).ranges == ((1, 8, 3),)  # one range: the faster at 1


def test_bad_input_is_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError, match="needs measured load points"):
        draft_schedule([])
    with pytest.raises(ConfigError, match="two measurements"):
        draft_schedule([LoadPoint(1, 2, 10.0), LoadPoint(1, 2, 11.0)])
    with pytest.raises(ConfigError, match="contiguously"):
        DraftSchedule(((1, 4, 2), (6, 8, 0)))
    with pytest.raises(ConfigError, match="at least one range"):
        DraftSchedule(())
    with pytest.raises(ConfigError, match="invalid load point"):
        LoadPoint(0, 2, 1.0)


def test_load_points_from_results_rows() -> None:
    rows = [{"status": "ok", "concurrency": 1, "speculative": True, "num_draft_tokens": 3, "output_throughput": 9.0,
             "output_throughput_spread": float("nan")},
            {"status": "ok", "concurrency": 1, "speculative": False, "num_draft_tokens": 0, "output_throughput": 5.0,
             "output_throughput_spread": 0.02},
            {"status": "failed", "concurrency": 8, "speculative": False, "num_draft_tokens": 0,
             "output_throughput": 0.0}]
    assert load_points(rows) == [LoadPoint(1, 3, 9.0, 0.0), LoadPoint(1, 0, 5.0, 0.02)]


def test_a_schedule_becomes_the_vllm_engines_speculative_config() -> None:
    from orchestrator.backends.vllm import speculative_config
    from orchestrator.config import EngineConfig

    base = EngineConfig(backend="vllm", model="/m", max_batch_size=512)
    cfg = DraftSchedule(((1, 4, 4), (5, 128, 2), (129, 512, 0))).apply_to(base)
    assert cfg.num_draft_tokens == 4 and cfg.label().startswith("vllm-mtp4sched")
    assert speculative_config(cfg) == {"method": "mtp", "num_speculative_tokens": 4,
                                       "num_speculative_tokens_per_batch_size": [[1, 4, 4], [5, 128, 2], [129, 512, 0]]}
    assert DraftSchedule(((1, 512, 3),)).apply_to(base).draft_schedule is None  # one length: a fixed engine
    assert not DraftSchedule(((1, 512, 0),)).apply_to(base).speculative
    sim = EngineConfig(backend="sim", simulated_backend="vllm", model="intern-s2-preview-8xh200", tp=8)
    argv = DraftSchedule(((1, 8, 3), (9, 64, 1))).apply_to(sim).command(host="h", port=1)
    assert '"num_speculative_tokens_per_batch_size":[[1,8,3],[9,64,1]]' in argv[argv.index("--speculative-config") + 1]


def _row(k: int, concurrency: int, throughput: float, *, primary: bool, temperature: float = 0.0) -> dict:
    return {"status": "ok", "engine": "vllm", "bucket": "le256", "primary_load": primary, "temperature": temperature,
            "concurrency": concurrency, "speculative": k > 0, "num_draft_tokens": k, "output_throughput": throughput,
            "output_throughput_spread": None, "backend": "vllm", "model": "/m", "tp": 1, "memory_fraction": 0.8,
            "max_batch_size": 128, "session_len": None, "max_prefill_tokens": 8192, "extra_flags": "",
            "simulated_backend": None}


def test_the_sweeps_table_serves_one_scheduled_vllm_engine_instead_of_engines_split_by_load() -> None:
    import pandas as pd

    from orchestrator import table as routing
    from orchestrator.config import EngineConfig
    from orchestrator.fsutil import utc_now_iso
    from tuning.schedule import schedule_lines, schedule_table

    vllm = EngineConfig(backend="vllm", model="/m", tp=1, max_batch_size=128)
    mtp3 = vllm.replace(speculative_algorithm="qwen3_5_mtp", num_draft_tokens=3)
    lmdeploy = EngineConfig(backend="pytorch", model="/m", tp=1, max_batch_size=128)
    table = routing.parse({
        "provenance": {"model": "/m", "gpu_type": "H200", "gpu_count": 1, "sweep_id": "s", "created_at": utc_now_iso(),
                       "simulated": False},
        "default_temperature": 1.0,
        "buckets": [{"name": "le256", "max_output_len": 256, "config": mtp3.to_dict(),
                     "figures": {"output_throughput": 300.0},
                     "cells": [{"sampling": None, "min_in_flight": 128, "config": vllm.to_dict(),
                                "figures": {"output_throughput": 4000.0}},
                               {"sampling": "sampled", "min_in_flight": 1, "config": lmdeploy.to_dict(),
                                "figures": {"output_throughput": 250.0}}]}],
    })
    results = pd.DataFrame([_row(3, 1, 300.0, primary=True), _row(0, 1, 200.0, primary=False),
                            _row(3, 16, 1500.0, primary=False), _row(0, 16, 1450.0, primary=False),
                            _row(3, 128, 3000.0, primary=False), _row(0, 128, 4000.0, primary=False),
                            _row(0, 1, 999.0, primary=False, temperature=0.8)])  # another temperature: not used
    out = routing.parse(schedule_table(table, results).model_dump(mode="json"))
    bucket = out.bucket("le256")
    assert bucket.engine_config().draft_schedule == ((1, 45, 3), (46, 128, 0))
    assert [c.engine for c in bucket.cells] == ["pytorch"]  # the load cell is the schedule's now; other engine kept
    assert "draft schedule [[1, 45, 3], [46, 128, 0]]" in out.provenance.notes[-1]
    assert schedule_lines(out) == ["le256: --speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":3,"
                                   "\"num_speculative_tokens_per_batch_size\":[[1,45,3],[46,128,0]]}'"]
    # a table without vLLM, or results at one load level, is left as it was
    assert schedule_table(table, results[results.concurrency == 1]) == table
