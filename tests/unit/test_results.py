"""pick_best: pure choice of the routing table from a results frame; incomplete results refused."""
from __future__ import annotations

import pandas as pd
import pytest

from orchestrator import table as routing
from orchestrator.config import EngineConfig
from orchestrator.table import Provenance
from tuning.buckets import make_buckets
from tuning.choose.constraints import Constraints
from tuning.choose.pick import IncompleteResultsError, pick_best
from tuning.results import (
    STATUS_FAILED,
    STATUS_OK,
    bench_status,
    results_frame,
    rows_for_trial,
    write_results,
)
from tuning.sweep.space import ROLE_MTP_OFF, ROLE_SEARCH, ROLE_STATIC

BUCKETS = make_buckets((1024, 16384), concurrency_levels=(64, 128), num_prompts=64)
PROV = Provenance(model="intern-s2-preview-8xh200", gpu_type="none (simulated)", gpu_count=0, sweep_id="t",
                  created_at="2026-11-29T00:00:00+00:00", simulated=True)


def _cfg(drafts: int) -> EngineConfig:
    return EngineConfig(backend="sim", model="intern-s2-preview-8xh200", tp=8, memory_fraction=0.8,
                        speculative_algorithm="qwen3_5_mtp" if drafts else None, num_draft_tokens=drafts)


def _bench(tput: float, *, tpot: float = 10.0, failed: int = 0) -> dict:
    lat = {"mean": tpot, "median": tpot, "p99": tpot * 2}
    return {"output_throughput": tput, "request_throughput": 1.0, "completed": 64 - failed, "failed": failed,
            "failure_reasons": {"timeout": failed} if failed else {}, "ttft_ms": lat, "tpot_ms": lat,
            "itl_ms": lat, "e2e_ms": lat, "accept_length": 3.0, "simulated": True}


def _trial(tid: str, role: str, drafts: int, figures: dict, failure: str = "") -> list[dict]:
    """figures: {(bucket, conc): throughput or (throughput, tpot)}"""
    meas = {}
    for k, v in figures.items():
        tput, tpot = (v if isinstance(v, tuple) else (v, 10.0))
        meas[k] = _bench(tput, tpot=tpot)
    return rows_for_trial(sweep_id="t", trial_id=tid, role=role, config=_cfg(drafts), buckets=BUCKETS,
                          measurements=meas, failure=failure)


def _all(off: dict, static: dict, *others: tuple) -> pd.DataFrame:
    rows = _trial("a", ROLE_MTP_OFF, 0, off) + _trial("b", ROLE_STATIC, 4, static)
    for tid, drafts, figs in others:
        rows += _trial(tid, ROLE_SEARCH, drafts, figs)
    return results_frame(rows)


FULL_OFF = {("le1024", 64): 6000, ("le1024", 128): 9000, ("le16384", 64): 6200, ("le16384", 128): 9500}
FULL_STATIC = {("le1024", 64): 8400, ("le1024", 128): 8000, ("le16384", 64): 13000, ("le16384", 128): 11000}


def test_per_bucket_best_gains_and_load_cells():
    df = _all(FULL_OFF, FULL_STATIC,
              ("c", 3, {("le1024", 64): 8600, ("le1024", 128): 8100, ("le16384", 64): 12000, ("le16384", 128): 10000}))
    table = pick_best(df, BUCKETS, provenance=PROV)
    b1, b2 = table.bucket("le1024"), table.bucket("le16384")
    assert b1.engine_config().num_draft_tokens == 3 and b2.engine_config().num_draft_tokens == 4
    assert b1.gains["mtp_off"] == pytest.approx(8600 / 6000 - 1) and b1.gains["static"] == pytest.approx(8600 / 8400 - 1)
    assert b2.gains["static"] == pytest.approx(0.0)
    # At concurrency 128 MTP off wins both buckets -> a load cell of every band each.
    assert [(c.sampling, c.min_in_flight) for c in b1.cells] == [(None, 128)]
    assert not b1.cells[0].engine_config().speculative
    assert routing.parse(table.model_dump(mode="json")) == table  # valid per the schema


def test_constraints_exclude_slow_configs():
    slow = {k: (v * 1.1, 50.0) for k, v in FULL_STATIC.items()}
    df = _all(FULL_OFF, FULL_STATIC, ("c", 5, slow))
    assert pick_best(df, BUCKETS, provenance=PROV).bucket("le1024").engine_config().num_draft_tokens == 5
    t = pick_best(df, BUCKETS, Constraints(max_tpot_ms=20), provenance=PROV)
    assert t.bucket("le1024").engine_config().num_draft_tokens == 4
    assert t.provenance.constraints == {"max_tpot_ms": 20}


def test_failed_rows_and_requests_never_win():
    rows = _all(FULL_OFF, FULL_STATIC).to_dict("records")
    rows += _trial("d", ROLE_SEARCH, 2, {}, failure="engine failed to start: OOM")
    crash = _trial("e", ROLE_SEARCH, 6, {k: 99999 for k in FULL_OFF})
    for r in crash:
        r.update(status="failed", failure_reason="3 of 64 requests failed")
    df = results_frame(rows + crash)
    t = pick_best(df, BUCKETS, provenance=PROV)
    assert all(b.figures.output_throughput < 99999 for b in t.buckets)
    assert (df[df.trial_id == "d"].failure_reason == "engine failed to start: OOM").all()


def test_partial_request_failures_mark_the_row_failed():
    rows = rows_for_trial(sweep_id="t", trial_id="x", role=ROLE_SEARCH, config=_cfg(1), buckets=BUCKETS,
                          measurements={("le1024", 64): _bench(5000, failed=2)})
    r = rows[0]
    assert r["status"] == "failed" and "2 of 64" in r["failure_reason"]


@pytest.mark.parametrize("drop, message", [
    (lambda df: df[~((df.role == ROLE_MTP_OFF) & (df.bucket == "le16384"))], "baseline 'mtp_off'"),
    (lambda df: df[df.role != ROLE_STATIC], "baseline 'static'"),
    (lambda df: df[df.bucket != "le1024"], "bucket le1024: no successful trial"),
    (lambda df: df.iloc[0:0], "no results"),
])
def test_incomplete_results_raise_and_keep_the_old_table(tmp_path, drop, message):
    df = _all(FULL_OFF, FULL_STATIC)
    path = tmp_path / "routing_table.json"
    routing.commit(pick_best(df, BUCKETS, provenance=PROV), path)
    before = path.read_text()
    with pytest.raises(IncompleteResultsError, match=message):
        routing.commit(pick_best(drop(df), BUCKETS, provenance=PROV), path)
    assert path.read_text() == before


def test_results_files_round_trip(tmp_path):
    df = _all(FULL_OFF, FULL_STATIC, ("d", 2, {}))
    pq, csv = write_results(df, tmp_path)
    back = pd.read_parquet(pq)
    assert len(back) == len(df) == 3 * 4 and set(back.status) == {"ok", "failed"}
    assert {"engine_key", "num_draft_tokens", "output_throughput", "tpot_ms_median", "sweep_id",
            "failure_reason", "concurrency", "bucket"} <= set(back.columns)
    assert pd.read_csv(csv).shape[0] == len(df)


def test_early_stopped_run_with_no_completed_request_counts_but_an_empty_run_does_not():
    """Long buckets stop at steady state before any 16k-token request finishes: that is a
    measurement (cancelled requests are not failures); a run with nothing completed is not."""
    early = {**_bench(9000.0), "completed": 0, "cancelled": 64, "early_stopped": True,
             "steady_state": {"throughput": 9000.0, "half_width": 90.0}}
    assert bench_status(early) == (STATUS_OK, "")
    empty = {**_bench(0.0), "completed": 0}
    status, reason = bench_status(empty)
    assert status == STATUS_FAILED and "no request completed" in reason


# ----- rounds: two configs are called different only when their intervals say so ---------------------
def _rounds_trial(tid: str, role: str, drafts: int, rounds: dict) -> list[dict]:
    """rounds: {(bucket, conc): [throughput per round]} -> rows as a --repeats sweep writes them."""
    from tuning.sweep.measure import representative_run

    meas = {k: representative_run([_bench(t) for t in runs]) for k, runs in rounds.items()}
    return rows_for_trial(sweep_id="t", trial_id=tid, role=role, config=_cfg(drafts), buckets=BUCKETS,
                          measurements=meas, failure="")


def _rounds_frame(mtp3_le1024: list[float], spread: float = 0.03) -> pd.DataFrame:
    three = lambda x: [x * (1 - spread), x, x * (1 + spread)]  # noqa: E731
    static = {k: three(v) for k, v in FULL_STATIC.items()}  # MTP-4: le1024 8400 (8148-8652), le16384 13000
    off = {k: three(v) for k, v in FULL_OFF.items()}
    mtp3 = {("le1024", 64): mtp3_le1024, ("le1024", 128): three(8100), ("le16384", 64): three(12000),
            ("le16384", 128): three(10000)}
    return results_frame(_rounds_trial("a", ROLE_MTP_OFF, 0, off) + _rounds_trial("b", ROLE_STATIC, 4, static)
                         + _rounds_trial("c", ROLE_SEARCH, 3, mtp3))


def test_a_bucket_keeps_the_shared_config_when_its_best_is_within_noise():
    """MTP-3 measures best on le1024 (8,600 vs MTP-4's 8,400) but within the noise of three rounds (the
    interval of their ratio, at the noise pooled over the sweep, holds 1), and MTP-4 clearly wins
    le16384: one config serves both buckets, and the table says why."""
    table = pick_best(_rounds_frame([8500, 8600, 8900]), BUCKETS, provenance=PROV)
    b1, b2 = table.bucket("le1024"), table.bucket("le16384")
    assert b1.engine_config() == b2.engine_config() and b1.engine_config().num_draft_tokens == 4
    assert b1.figures.rounds == 3 and b1.figures.output_throughput_ci[0] < 8400 < b1.figures.output_throughput_ci[1]
    noise, note = table.provenance.notes
    assert noise.startswith("noise: one round's throughput moves") and "pooled" in noise
    assert note.startswith("le1024:") and "within noise" in note and "ratio holds 1" in note
    assert routing.parse(table.model_dump(mode="json")) == table


def test_a_bucket_gets_its_own_config_when_the_intervals_part():
    """Tight rounds: MTP-3 is shown above MTP-4 on le1024, MTP-4 above MTP-3 on le16384."""
    table = pick_best(_rounds_frame([9500, 9520, 9540], spread=0.005), BUCKETS, provenance=PROV)
    assert table.bucket("le1024").engine_config().num_draft_tokens == 3
    assert table.bucket("le16384").engine_config().num_draft_tokens == 4
    assert [n.split(":")[0] for n in table.provenance.notes] == ["noise"]
    # Every other config's rounds 6 % apart: MTP-4's lead on le16384 (13,000 vs 12,000) is then within
    # noise, and MTP-3, still shown best on le1024 (9,520 vs 8,400), serves both.
    loose = pick_best(_rounds_frame([9500, 9520, 9540], spread=0.06), BUCKETS, provenance=PROV)
    assert {b.engine_config().num_draft_tokens for b in loose.buckets} == {3}
    assert [n.split(":")[0] for n in loose.provenance.notes][:2] == ["noise", "le16384"]
    # the load level is a cell dimension: its comparisons are left within noise at the loose rounds too
    assert all(n.startswith("le16384 greedy@128") and "within noise" in n for n in loose.provenance.notes[2:])


def test_two_rounds_a_cell_are_told_apart_by_the_noise_pooled_over_the_sweep():
    """Two rounds per measurement: each one's own 95 % interval is 12.7 standard errors wide and they
    all overlap, but the rounds of all measurements together fix the noise, and a 20 % lead of rounds
    that move 2 % is real."""
    from tuning.choose.noise import pooled_noise, throughput_interval, within_noise
    from tuning.choose.rank import consolidate

    rows = [{"engine_key": k, "output_throughput": lo, "output_throughput_repeats": f"{lo};{hi}", "status": "ok"}
            for k, lo, hi in (("x", 118.0, 121.0), ("y", 98.0, 101.0))]
    ia, ib = (throughput_interval(r) for r in rows)
    assert ia[0] < ib[1]  # the measurements' own intervals overlap
    noise = pooled_noise(pd.DataFrame(rows))
    assert noise.df == 2 and 0.01 < noise.sd < 0.03
    assert within_noise(rows[0], rows[1]) and not within_noise(rows[0], rows[1], noise)
    assert [r["engine_key"] for r in consolidate([rows, rows[::-1]], noise)] == ["x", "y"]
    assert pooled_noise(pd.DataFrame([{**r, "output_throughput_repeats": None} for r in rows])) is None


def test_rows_measured_once_are_ranked_by_their_figure_as_before():
    from tuning.choose.noise import within_noise
    from tuning.choose.rank import consolidate

    once = [{"engine_key": k, "output_throughput": t} for k, t in (("x", 101.0), ("y", 100.0))]
    assert not within_noise(once[0], once[1])
    assert [r["engine_key"] for r in consolidate([once, once[::-1]])] == ["x", "y"]
    noisy = [{"engine_key": k, "output_throughput": t, "output_throughput_repeats": r}
             for k, t, r in (("x", 101.0, "99;101;103"), ("y", 100.0, "98;100;102"))]
    assert within_noise(noisy[0], noisy[1])
    assert [r["engine_key"] for r in consolidate([noisy, noisy[::-1]])] in (["x", "x"], ["y", "y"])
