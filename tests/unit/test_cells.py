"""Choosing a bucket's primary and its cells beyond noise, the traffic-mix prediction over cells, and
the small-sample statistics behind both."""
from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import table
from orchestrator.config import EngineConfig
from orchestrator.fsutil import utc_now_iso
from tuning.choose.cells import CellMeasurement, choose_cells
from tuning.choose.mix import predict_mix
from tuning.stats import mean_confidence_interval, rounds_for_half_width, t_quantile


def _cfg(drafts: int) -> dict:
    cfg = {"backend": "sim", "model": "m", "tp": 1, "memory_fraction": 0.5}
    if drafts:
        cfg |= {"speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": drafts}
    return cfg


def _m(drafts, band, in_flight, *tput, bucket="le1024"):
    return CellMeasurement(config=_cfg(drafts), bucket=bucket, band=band, in_flight=in_flight,
                           throughputs=tuple(float(t) for t in tput))


KEY = {d: EngineConfig.from_dict(_cfg(d)).key() for d in (0, 2, 4)}

# The H200 shape: MTP-4 best greedy, MTP off best sampled (T 0.8), MTP-2 at high load.
MEASURED = [
    _m(0, "greedy", 64, 1000, 1040, 980), _m(4, "greedy", 64, 1230, 1260, 1210), _m(2, "greedy", 64, 1170, 1150, 1190),
    _m(0, "sampled", 64, 1000, 1030, 990), _m(4, "sampled", 64, 660, 650, 680), _m(2, "sampled", 64, 770, 790, 760),
    _m(0, "greedy", 256, 2000, 2100, 1900), _m(4, "greedy", 256, 1950, 2150, 2000), _m(2, "greedy", 256, 2600, 2650, 2550),
    _m(0, "sampled", 256, 2000, 2050, 1980), _m(4, "sampled", 256, 1500, 1550, 1450), _m(2, "sampled", 256, 2000, 2150, 1950),
]


def test_primary_is_the_best_on_the_primary_cell_and_cells_only_beyond_noise():
    choice = choose_cells(MEASURED, primary_band="greedy", primary_in_flight=64)["le1024"]
    assert choice.primary_key == KEY[4]
    cells = {(c.sampling, c.min_in_flight): c.engine_config().key() for c in choice.cells}
    # sampled traffic: MTP off beats MTP-4 far beyond noise, from the lowest load up (one cell covers 256 too,
    # and every load below the lowest measured one: the router must not send sampled requests to MTP-4 when a
    # replica holds fewer than 64)
    assert cells[("sampled", 1)] == KEY[0]
    assert ("sampled", 256) not in cells  # MTP off still serves it: MTP-2 is within noise of it
    assert cells[("greedy", 256)] == KEY[2]
    assert any("sampled@256" in n and "within noise" in n for n in choice.notes)
    c = next(c for c in choice.cells if c.sampling == "sampled")
    assert c.primary_figures.output_throughput == pytest.approx(statistics.fmean([660, 650, 680]))
    assert c.gain() == pytest.approx(statistics.fmean([1000, 1030, 990]) / statistics.fmean([660, 650, 680]) - 1)
    lo, hi = c.figures.output_throughput_ci
    assert lo < c.figures.output_throughput < hi and c.figures.rounds == 3


def test_overlapping_intervals_keep_the_primary():
    noisy = [_m(4, "greedy", 64, 1000, 1200), _m(0, "greedy", 64, 900, 1000),
             _m(4, "sampled", 64, 700, 1300), _m(0, "sampled", 64, 1000, 1100)]
    choice = choose_cells(noisy, primary_band="greedy", primary_in_flight=64)["le1024"]
    assert choice.cells == () and "within noise" in choice.notes[0]


def test_cells_load_into_a_v2_routing_table():
    choice = choose_cells(MEASURED, primary_band="greedy", primary_in_flight=64)["le1024"]
    rt = table.parse({
        "provenance": {"model": "m", "gpu_type": "none (simulated)", "gpu_count": 0, "sweep_id": "t",
                       "created_at": utc_now_iso(), "simulated": True},
        "buckets": [{"name": "le1024", "max_output_len": 1024, "config": dict(choice.primary_config),
                     "figures": choice.primary_figures.model_dump(mode="json"),
                     "cells": [c.model_dump(mode="json") for c in choice.cells]}],
    })
    b = rt.bucket("le1024")
    assert b.cell_for("sampled", 300).engine_config().key() == KEY[0]
    assert b.cell_for("greedy", 300).engine_config().key() == KEY[2]
    assert b.cell_for("greedy", 64) is None
    assert b.cell_for("sampled", 5).engine_config().key() == KEY[0]  # below the lowest measured load too
    assert len(rt.distinct_configs()) == 3


def test_the_mix_prediction_weighs_cells_by_tokens():
    choices = choose_cells(MEASURED, primary_band="greedy", primary_in_flight=64)
    pred = predict_mix(MEASURED, choices, {("le1024", "greedy"): 0.5, ("le1024", "sampled"): 0.5}, in_flight=64)
    greedy4, sampled0 = statistics.fmean([1230, 1260, 1210]), statistics.fmean([1000, 1030, 990])
    assert pred.per_bucket_throughput == pytest.approx(1 / (0.5 / greedy4 + 0.5 / sampled0))
    best_key, best = pred.best_single
    assert best_key == KEY[0]  # MTP off: 1000 / 1007 beats MTP-4's 1233 / 663 on this mix
    assert pred.ratio == pytest.approx(pred.per_bucket_throughput / best) and pred.ratio > 1.1
    only_greedy = predict_mix(MEASURED, choices, {("le1024", "greedy"): 1.0}, in_flight=64)
    assert only_greedy.ratio == pytest.approx(1.0)


def test_the_mix_prediction_covers_load_levels():
    # Half the tokens at 64 in flight, half at 256: the table serves greedy@64 with MTP-4, sampled with MTP off
    # (its cell from 64 up), greedy@256 with MTP-2 (its cell); each single config serves all four parts.
    choices = choose_cells(MEASURED, primary_band="greedy", primary_in_flight=64)
    shares = {("le1024", "greedy"): 0.5, ("le1024", "sampled"): 0.5}
    pred = predict_mix(MEASURED, choices, shares, in_flight={64: 1.0, 256: 1.0})
    f = statistics.fmean
    table_rates = [f([1230, 1260, 1210]), f([1000, 1030, 990]), f([2600, 2650, 2550]), f([2000, 2050, 1980])]
    assert pred.per_bucket_throughput == pytest.approx(1 / sum(0.25 / r for r in table_rates))
    assert set(pred.tokens) == {"le1024/greedy@64", "le1024/sampled@64", "le1024/greedy@256", "le1024/sampled@256"}
    off = [f([1000, 1040, 980]), f([1000, 1030, 990]), f([2000, 2100, 1900]), f([2000, 2050, 1980])]
    assert dict(pred.singles)[KEY[0]] == pytest.approx(1 / sum(0.25 / r for r in off))
    assert pred.ratio > 1.0
    # One level given as an int is the same as that level with all the tokens.
    assert predict_mix(MEASURED, choices, shares, in_flight={64: 3.0}).per_bucket_throughput == pytest.approx(
        predict_mix(MEASURED, choices, shares, in_flight=64).per_bucket_throughput)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="primary cell"):
        choose_cells([_m(0, "sampled", 64, 1, 2)], primary_band="greedy", primary_in_flight=64)
    with pytest.raises(ValueError, match="throughputs"):
        _m(0, "greedy", 64)
    choices = choose_cells(MEASURED, primary_band="greedy", primary_in_flight=64)
    with pytest.raises(ValueError, match="no output tokens"):
        predict_mix(MEASURED, choices, {("le1024", "greedy"): 0.0}, in_flight=64)
    with pytest.raises(ValueError, match="le9"):
        predict_mix(MEASURED, choices, {("le9", "greedy"): 1.0}, in_flight=64)
    with pytest.raises(ValueError, match="le1024/greedy@8"):
        predict_mix(MEASURED, choices, {("le1024", "greedy"): 1.0}, in_flight=8)
    with pytest.raises(ValueError, match="load shares"):
        predict_mix(MEASURED, choices, {("le1024", "greedy"): 1.0}, in_flight={64: -1.0})


@pytest.mark.parametrize("df, expected", [(1, 12.7062), (2, 4.3027), (3, 3.1824), (5, 2.5706), (30, 2.0423)])
def test_t_quantiles(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, rel=2e-3)


def test_rounds_for_a_half_width_are_the_fewest_whose_interval_is_that_narrow():
    """10 % per round, ±5 %: 17 rounds give 2.120 x 0.10 / sqrt(17) = 5.14 %, 18 give 2.110 x 0.10 / sqrt(18)
    = 4.97 %."""
    assert rounds_for_half_width(0.10, 0.05) == 18
    n = rounds_for_half_width(0.13, 0.05)
    assert t_quantile(0.975, n - 1) * 0.13 / n**0.5 <= 0.05 < t_quantile(0.975, n - 2) * 0.13 / (n - 1) ** 0.5
    assert rounds_for_half_width(0.0, 0.05) == 2  # a figure that never moves: the fewest rounds with a spread
    with pytest.raises(ValueError):
        rounds_for_half_width(0.1, 0.0)


def test_confidence_interval_edges():
    assert mean_confidence_interval([5.0]) == (5.0, 5.0, 5.0)
    with pytest.raises(ValueError):
        mean_confidence_interval([])
    with pytest.raises(ValueError):
        t_quantile(1.0, 3)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(1, 1e4, allow_nan=False), min_size=2, max_size=12))
def test_the_interval_holds_the_mean_and_narrows_with_level(xs):
    mean, lo, hi = mean_confidence_interval(xs, 0.95)
    _, lo90, hi90 = mean_confidence_interval(xs, 0.90)
    assert lo <= mean <= hi and lo <= lo90 + 1e-9 and hi90 <= hi + 1e-9
    assert math.isclose(mean, statistics.fmean(xs))


def test_a_noise_floor_for_figures_measured_once_and_a_primary_chosen_by_the_caller():
    once = [_m(4, "greedy", 64, 1000), _m(0, "greedy", 64, 990), _m(4, "sampled", 64, 1000), _m(0, "sampled", 64, 1020)]
    assert choose_cells(once, primary_band="greedy", primary_in_flight=64)["le1024"].cells != ()
    floor = choose_cells(once, primary_band="greedy", primary_in_flight=64, min_gain=0.03)["le1024"]
    assert floor.cells == () and "within noise" in floor.notes[0]
    forced = choose_cells(once, primary_band="greedy", primary_in_flight=64, primary_keys={"le1024": KEY[0]})
    assert forced["le1024"].primary_key == KEY[0] and forced["le1024"].cells == ()
    with pytest.raises(ValueError, match="not measured on the primary cell"):
        choose_cells(once, primary_band="greedy", primary_in_flight=64, primary_keys={"le1024": KEY[2]})


def test_two_rounds_a_cell_get_their_cell_only_at_the_noise_pooled_over_the_sweep():
    """The H200 payoff sweep's le1024 rounds (trained test checkpoint, two rounds per cell): MTP-4 over
    MTP off 1.81x greedy and 0.69x sampled at 16 in flight. Each measurement's own two-round interval
    overlaps the other's, so the sampled cell is never written; at the noise pooled over the sweep's
    measurements (~11 % a round, 8 df) the sampled ratio's interval lies below 1, so MTP off gets the cell (from
    one request in flight: 16 is the lowest level measured), and it serves sampled requests at 64 too."""
    from tuning.stats import PooledNoise

    h200 = [_m(0, "greedy", 16, 3067.3, 2901.3), _m(4, "greedy", 16, 6202.8, 4682.9),
            _m(0, "sampled", 16, 3737.0, 2996.4), _m(4, "sampled", 16, 2288.0, 2337.1),
            _m(0, "greedy", 64, 9913.5, 10995.5), _m(4, "greedy", 64, 15812.7, 14158.8),
            _m(0, "sampled", 64, 9833.1, 8838.0), _m(4, "sampled", 64, 8048.8, 8275.0)]
    alone = choose_cells(h200, primary_band="greedy", primary_in_flight=16)["le1024"]
    assert alone.primary_key == KEY[4] and alone.cells == ()
    noise = PooledNoise.of(m.throughputs for m in h200)
    pooled = choose_cells(h200, primary_band="greedy", primary_in_flight=16, noise=noise)["le1024"]
    assert pooled.primary_key == KEY[4]
    assert [(c.sampling, c.min_in_flight, c.engine_config().key()) for c in pooled.cells] == [("sampled", 1, KEY[0])]
    assert pooled.key_for("sampled", 64) == KEY[0] and pooled.key_for("greedy", 64) == KEY[4]


def test_a_within_noise_note_at_the_pooled_noise_names_the_rounds_that_would_tell():
    """Illustrative figures: two rounds a config, MTP off measured 1.06x MTP-4 on sampled requests at a log
    sd of 0.11 over 8 df. Not shown, so MTP-4 keeps the cell, and the note says how many rounds per config
    would tell a gap of that size apart (73 at 80 % power), not only "within noise". A gain shown at the
    noise but under ``min_gain`` is named as shown, not as within noise, and is not undecided."""
    import re

    from tuning.stats import PooledNoise

    noise = PooledNoise(0.11, 8)
    two = [_m(4, "greedy", 16, 6000, 6100), _m(0, "greedy", 16, 3000, 3050),
           _m(4, "sampled", 16, 2000, 2040), _m(0, "sampled", 16, 2100, 2183)]
    choice = choose_cells(two, primary_band="greedy", primary_in_flight=16, noise=noise)["le1024"]
    assert choice.primary_key == KEY[4] and choice.cells == ()
    (note,) = choice.notes
    ratio, low, high = noise.ratio_interval([2100, 2183], [2000, 2040])
    rounds = noise.rounds_to_separate(ratio)
    assert rounds == 73 and f"{ratio:.2f}x" == "1.06x"
    assert note.startswith("sampled@16: ") and "within noise" in note and note.endswith(f": kept {KEY[4]}")
    assert f"({ratio:.2f}x, 95 % {low:.2f}-{high:.2f}; ~{rounds} rounds per config" in note
    assert re.search(r"~73 rounds per config would tell a gap this size apart at 80 % power\)", note)
    # Shown at the pooled noise (1.5x) but under a 60 % floor: the gain, not the noise, kept it.
    shown = [*two[:2], _m(4, "sampled", 16, 2000, 2040), _m(0, "sampled", 16, 3000, 3060)]
    floor = choose_cells(shown, primary_band="greedy", primary_in_flight=16, noise=noise, min_gain=0.6)["le1024"]
    assert floor.cells == () and "shown above it but by no more than 60%: kept" in floor.notes[0]
    assert "rounds per config" not in floor.notes[0] and "within noise" not in floor.notes[0]
    assert floor.undecided == () and [(u.band, u.in_flight) for u in choice.undecided] == [("sampled", 16)]
