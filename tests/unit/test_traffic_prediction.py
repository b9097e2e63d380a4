"""The sweep summary's traffic-mix line over several load levels: the table (primary + cells by
sampling band and load) against every single config, each part of the mix (bucket x band x level)
weighed by its tokens, from a hand-made results frame."""
from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from orchestrator.config import EngineConfig
from orchestrator.table import Provenance
from tuning.buckets import make_buckets
from tuning.choose.pick import pick_best
from tuning.results import results_frame, rows_for_trial
from tuning.sweep.space import ROLE_MTP_OFF, ROLE_SEARCH, ROLE_STATIC
from tuning.sweep.summary import traffic_line
from tuning.traffic import TrafficMix

BUCKETS = make_buckets((1024,), concurrency_levels=(64, 256), num_prompts=64, temperatures=(0.0, 0.8))
PROV = Provenance(model="intern-s2-preview-8xh200", gpu_type="none (simulated)", gpu_count=0, sweep_id="t",
                  created_at="2026-12-01T00:00:00+00:00", simulated=True)
# (concurrency, temperature) -> tok/s: MTP-4 wins greedy at 64, MTP-2 greedy at 256, MTP off sampled.
FIGURES = {
    0: {(64, 0.0): 1000, (64, 0.8): 1000, (256, 0.0): 2000, (256, 0.8): 2000},
    4: {(64, 0.0): 1400, (64, 0.8): 600, (256, 0.0): 1900, (256, 0.8): 1300},
    2: {(64, 0.0): 1200, (64, 0.8): 750, (256, 0.0): 2800, (256, 0.8): 1700},
}


def _bench(tput: float) -> dict:
    lat = {"mean": 10.0, "median": 10.0, "p99": 20.0}
    return {"output_throughput": tput, "request_throughput": 1.0, "completed": 64, "failed": 0, "failure_reasons": {},
            "ttft_ms": lat, "tpot_ms": lat, "itl_ms": lat, "e2e_ms": lat, "accept_length": 2.0, "simulated": True,
            "repeat_output_throughputs": [tput * 0.99, tput, tput * 1.01]}


def _frame():
    rows = []
    for tid, role, drafts in (("a", ROLE_MTP_OFF, 0), ("b", ROLE_STATIC, 4), ("c", ROLE_SEARCH, 2)):
        cfg = EngineConfig(backend="sim", model="intern-s2-preview-8xh200", tp=8, memory_fraction=0.8,
                           speculative_algorithm="qwen3_5_mtp" if drafts else None, num_draft_tokens=drafts)
        meas = {BUCKETS[0].measurement_key(c, t): _bench(v) for (c, t), v in FIGURES[drafts].items()}
        rows += rows_for_trial(sweep_id="t", trial_id=tid, role=role, config=cfg, buckets=BUCKETS, measurements=meas)
    return results_frame(rows)


def test_the_prediction_covers_every_measured_load_level():
    df = _frame()
    table = pick_best(df, BUCKETS, provenance=PROV)
    mix = TrafficMix.model_validate({"classes": [{"max_tokens": 1000, "temperature": 0.0, "share": 1},
                                                 {"max_tokens": 1000, "temperature": 0.8, "share": 1}]})
    line = traffic_line(table, df, SimpleNamespace(buckets=BUCKETS), mix)
    assert "over load levels 64/256 in equal token shares" in line, line
    # Table: greedy@64 MTP-4 1400, sampled@64 off 1000, greedy@256 MTP-2 2800, sampled@256 off 2000 (as far as
    # the table's cells say; the expected value is what those cells serve), a quarter of the tokens each.
    bucket = table.bucket("le1024")
    served = {}
    for band, level in (("greedy", 64), ("sampled", 64), ("greedy", 256), ("sampled", 256)):
        cell = bucket.cell_for(band, level)
        drafts = (cell.engine_config() if cell else bucket.engine_config()).num_draft_tokens or 0
        served[(band, level)] = FIGURES[drafts][(level, 0.0 if band == "greedy" else 0.8)]
    table_rate = 1 / sum(0.25 / v for v in served.values())
    singles = [1 / sum(0.25 / v for v in figs.values()) for figs in FIGURES.values()]
    assert served[("greedy", 64)] == 1400 and served[("sampled", 64)] == 1000
    expected = table_rate / max(singles)
    assert float(re.search(r"([0-9.]+)x \(the mix", line).group(1)) == pytest.approx(expected, abs=0.006), line
    assert expected > 1.1


def test_a_table_no_better_than_one_config_on_the_users_mix_gives_way_to_it():
    from tuning.choose.prediction import predict_on_mix
    from tuning.choose.table import no_worse_than_one_config

    df = _frame()
    table = pick_best(df, BUCKETS, provenance=PROV)
    assert len(table.distinct_configs()) > 1
    both = TrafficMix.model_validate({"classes": [{"max_tokens": 1000, "temperature": 0.0, "share": 1},
                                                  {"max_tokens": 1000, "temperature": 0.8, "share": 1}]})
    assert no_worse_than_one_config(table, df, BUCKETS, both) == table  # it pays there (test above)
    # All sampled: the cells send sampled requests to MTP off at 64 (1000) and at 256 (2000) — MTP off alone
    # serves the mix as well with one engine, so it serves every bucket, with its own figures.
    sampled = TrafficMix.model_validate({"classes": [{"max_tokens": 1000, "temperature": 0.8, "share": 1}]})
    pred, _ = predict_on_mix(table, df, BUCKETS, sampled)
    assert pred.ratio == pytest.approx(1.0)
    one = no_worse_than_one_config(table, df, BUCKETS, sampled)
    (b,) = one.buckets
    assert b.engine_config().num_draft_tokens in (None, 0) and b.cells == () and b.figures.output_throughput == 1000
    assert b.gains["mtp_off"] == pytest.approx(0.0) and one.provenance.notes[-1].startswith("one config everywhere")
    assert no_worse_than_one_config(one, df, BUCKETS, sampled) == one  # already one config: unchanged


def test_on_whole_engines_one_config_can_carry_the_mix_and_the_table_loses():
    """The table that pays with the engines' time split at will (above) deploys one engine per config
    without --serve-gpus: MTP off then carries half the mix's tokens (both sampled parts) on one engine
    of three, and the whole table waits on it. The summary says so. A config the mix does not reach
    idles on its engine (a greedy-only mix leaves MTP off's idle)."""
    from tuning.choose.prediction import predict_on_engines

    df = _frame()
    table = pick_best(df, BUCKETS, provenance=PROV)
    keys = {(c.num_draft_tokens or 0): k for k, c in table.distinct_configs().items()}
    assert sorted(keys) == [0, 2, 4] and table.provenance.gpu_budget is None
    mix = TrafficMix.model_validate({"classes": [{"max_tokens": 1000, "temperature": 0.0, "share": 1},
                                                 {"max_tokens": 1000, "temperature": 0.8, "share": 1}]})
    # Work per token of the mix (a quarter on each part): MTP-4 .25/1400, MTP-2 .25/2800, MTP off .25/1000 +
    # .25/2000; the best single config on three engines is MTP off: 3 / (.25 * (2/1000 + 2/2000)).
    off_work = 0.25 / 1000 + 0.25 / 2000
    line = traffic_line(table, df, SimpleNamespace(buckets=BUCKETS), mix)
    assert "on 3 engines, one per config" in line, line
    ratio = float(re.search(r"on as many: ([0-9.]+)x", line).group(1))
    assert ratio == pytest.approx((1 / off_work) / (3 / (0.25 * (2 / 1000 + 2 / 2000))), abs=0.006), line
    # A second engine for MTP off: the table as fast as MTP off alone on four.
    four, _ = predict_on_engines(table, df, BUCKETS, mix, {keys[0]: 2, keys[2]: 1, keys[4]: 1})
    assert four.engines == 4 and four.throughput == pytest.approx(2 / off_work) and four.ratio == pytest.approx(1.0)
    assert predict_on_engines(table, df, BUCKETS, mix, {keys[2]: 1, keys[4]: 1})[0] is None  # MTP off has none
    # Greedy only: MTP-4 (1400 at 64) and MTP-2 (2800 at 256) carry it, MTP off idles on the third engine;
    # the best single on three is MTP-2: 3 / (.5/1200 + .5/2800).
    greedy = TrafficMix.model_validate({"classes": [{"max_tokens": 1000, "temperature": 0.0, "share": 1}]})
    idle, _ = predict_on_engines(table, df, BUCKETS, greedy)
    assert idle.engines == 3 and idle.throughput == pytest.approx(1 / (0.5 / 1400))
    assert idle.ratio == pytest.approx((1 / (0.5 / 1400)) / (3 / (0.5 / 1200 + 0.5 / 2800)))
