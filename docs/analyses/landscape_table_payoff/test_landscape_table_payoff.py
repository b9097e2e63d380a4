"""The landscape payoff prediction: a table over a hand-made landscape where one config is best greedy and
another sampled, the mix file's checks, and one run's noise from repeat pairs."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from docs.analyses.landscape_table_payoff import landscape_table_payoff as ltp
from tuning.stats import PooledNoise, t_quantile

ROOT = Path(__file__).resolve().parents[3]

OFF, MTP3, MTP3_LOW = "mtp-off", "a0.9-mtp3", "a0.7-mtp3"
G128, G512, S128, S512 = ("out128", "greedy"), ("out512", "greedy"), ("out128", "sampled"), ("out512", "sampled")


def _cell(engine, agreement, drafts, out, t, c, tok_s, run_s=5.0):
    return {"engine": engine, "agreement": agreement, "draft_tokens": drafts, "output_len": out, "temperature": t,
            "concurrency": c, "output_throughput": tok_s, "failed": 0, "duration_s": run_s}


def _landscape(mtp_greedy=200.0, mtp_sampled=50.0, off=100.0, superseded=None):
    """MTP-3 (agreement 0.9) makes ``mtp_greedy`` greedy and ``mtp_sampled`` sampled, MTP off ``off`` on every
    part, at concurrency 16; an agreement-0.7 MTP-3 a little slower than MTP off everywhere."""
    cells = {}
    for out in (128, 512):
        for t in (0.0, 0.8):
            cells[f"{OFF}|out{out}|T{t:g}|c16"] = _cell(OFF, None, 0, out, t, 16, off)
            cells[f"{MTP3}|out{out}|T{t:g}|c16"] = _cell(MTP3, 0.9, 3, out, t, 16, mtp_greedy if t == 0 else mtp_sampled)
            cells[f"{MTP3_LOW}|out{out}|T{t:g}|c16"] = _cell(MTP3_LOW, 0.7, 3, out, t, 16, 0.9 * off)
    return {"cells": cells, "superseded": superseded or {}, "host": {"gpu_type": "test"}, "commands": ["made by hand"]}


def _rates(landscape, agreement=0.9):
    return ltp.rates_at(landscape["cells"], agreement, 16)


def test_a_table_beats_both_singles_when_the_best_config_moves_with_temperature():
    rates = _rates(_landscape())
    # Half the tokens greedy: MTP off makes 1 / (0.5/100 + 0.5/100) = 100 tok/s, MTP-3 1 / (0.5/200 + 0.5/50) = 80.
    half = ltp.default_mixes(["out128", "out512"], [0.5])["greedy 0.5"]
    pay = ltp.payoff(rates, half)
    assert (pay.single, pay.single_rate) == (OFF, pytest.approx(100.0))
    # Time split at will: greedy on MTP-3, sampled on MTP off, 1 / (0.5/200 + 0.5/100) = 133.3 tok/s.
    assert pay.fastest == {G128: MTP3, G512: MTP3, S128: OFF, S512: OFF}
    assert pay.pooled_ratio == pytest.approx(4 / 3)
    # On 2 whole replicas the MTP-3 one finishes its half in half the time and idles: no better than MTP off on both.
    assert pay.whole_ratio == pytest.approx(1.0)


def test_on_whole_replicas_a_table_pays_when_its_engines_have_equal_work():
    # MTP-3 240 tok/s greedy, 50 sampled; two thirds of the tokens greedy. Best single: MTP-3,
    # 1 / (2/3/240 + 1/3/50) = 105.9 tok/s (MTP off 100). Time split: 1 / (2/3/240 + 1/3/100) = 163.6.
    # Two replicas, one each: works 2/3/240 and 1/3/100, 1 / max(...) = 300 tok/s against 2 x 105.9.
    rates = _rates(_landscape(mtp_greedy=240.0))
    third = {G128: 1 / 3, G512: 1 / 3, S128: 1 / 6, S512: 1 / 6}
    pay = ltp.payoff(rates, third)
    single = 1 / (2 / 3 / 240 + 1 / 3 / 50)
    assert pay.single == MTP3 and pay.single_rate == pytest.approx(single)
    assert pay.pooled_ratio == pytest.approx(1 / (2 / 3 / 240 + 1 / 3 / 100) / single)
    assert pay.whole_ratio == pytest.approx(300 / (2 * single)) and pay.whole_replicas == {MTP3: 1, OFF: 1}
    assert pay.whole_routes == pay.fastest == {G128: MTP3, G512: MTP3, S128: OFF, S512: OFF}
    drivers = ltp.drivers(rates, third, pay.single, pay.whole_routes)
    assert {d["part"] for d in drivers} == {"out128/sampled", "out512/sampled"} and all(d["gain"] == 2.0 for d in drivers)


def test_a_config_best_everywhere_leaves_nothing_to_route():
    rates = _rates(_landscape(mtp_greedy=200.0, mtp_sampled=120.0))
    for shares in ltp.default_mixes(["out128", "out512"]).values():
        pay = ltp.payoff(rates, shares)
        assert pay.single == MTP3 and pay.pooled_ratio == pytest.approx(1.0) and pay.whole_ratio == pytest.approx(1.0)
        assert ltp.drivers(rates, shares, pay.single, pay.whole_routes) == []


def test_mtp_off_is_every_levels_baseline_and_unknown_temperatures_are_refused():
    land = _landscape()
    assert {k for k, *_ in _rates(land, 0.7)} == {OFF, MTP3_LOW}
    assert {k for k, *_ in _rates(land, 0.9)} == {OFF, MTP3}
    assert ltp.agreement_levels(land["cells"]) == [0.7, 0.9]
    with pytest.raises(ValueError, match="temperature 0.5"):
        ltp.part_of(_cell(OFF, None, 0, 128, 0.5, 16, 1.0))


PARTS = [G128, G512, S128, S512]


@pytest.mark.parametrize("data, message", [
    ([0.5, 0.5], "mapping of mix name"),
    ({"m": {"out1024/greedy": 1.0}}, r"unknown part\(s\) \['out1024/greedy'\]"),
    ({"m": {"out512/greedy": -0.5, "out512/sampled": 1.5}}, "numbers >= 0"),
    ({"m": {"out512/greedy": "half", "out512/sampled": 0.5}}, "numbers >= 0"),
    ({"m": {"out512/greedy": 0.5, "out512/sampled": 0.4}}, "sum to 0.9, not 1"),
    ({"m": 0.5}, "mapping of part -> share"),
])
def test_a_bad_mix_says_what_is_wrong(data, message):
    with pytest.raises(ValueError, match=message):
        ltp.parse_mixes(data, PARTS)


def test_a_mix_file_is_read_and_a_bad_one_stops_the_run_with_its_reason(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text("mostly_greedy:\n  out512/greedy: 0.8\n  out512/sampled: 0.2\n")
    assert ltp.load_mixes(good, PARTS) == {"mostly_greedy": {G512: 0.8, S512: 0.2}}
    land = tmp_path / "landscape.json"
    land.write_text(json.dumps(_landscape()))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"m": {"out512/greedy": 0.7}}))
    with pytest.raises(SystemExit):
        ltp.main(["--landscape", str(land), "--mix", str(bad), "--out-dir", str(tmp_path)])
    assert "bad.json: mix 'm': shares of output tokens sum to 0.7, not 1" in capsys.readouterr().err


def _repeats():
    """Two warm repeats of out512 (later / earlier 1.1 and 0.9) and one slow first pass of out128 (x2)."""
    def old(tok_s):
        return [{"output_throughput": tok_s, "duration_s": 4.0}]
    sup = {f"{OFF}|out512|T0|c16": old(100 / 1.1), f"{OFF}|out512|T0.8|c16": old(100 / 0.9), f"{OFF}|out128|T0|c16": old(50.0)}
    return _landscape(superseded=sup)


def test_one_runs_noise_comes_from_the_named_repeat_pairs_only():
    used, other = ltp.repeat_pairs(_repeats(), ["mtp-off|out512|"])
    assert sorted(p.key for p in used) == [f"{OFF}|out512|T0.8|c16", f"{OFF}|out512|T0|c16"]
    assert [p.key for p in other] == [f"{OFF}|out128|T0|c16"]
    noise = ltp.noise_of(used)
    # Each pair about its own mean: sd^2 = (ln(1.1)^2 + ln(0.9)^2) / 2 pairs / 2.
    sd = math.sqrt((math.log(1.1) ** 2 + math.log(0.9) ** 2) / 4)
    assert noise.df == 2 and noise.sd == pytest.approx(sd)
    low, high = ltp.single_ratio_band(noise)
    half = t_quantile(0.975, 2) * math.sqrt(2) * sd
    assert (low, high) == (pytest.approx(math.exp(-half)), pytest.approx(math.exp(half)))
    # The slow first pass would more than double the estimate.
    assert ltp.noise_of(used + other).sd > 2 * sd
    with pytest.raises(ValueError, match="no repeat pair"):
        ltp.noise_of([])


def test_without_interaction_no_table_pays_and_additive_rates_are_kept():
    rates = _rates(_landscape())
    null = ltp.without_interaction(rates)
    for shares in ltp.default_mixes(["out128", "out512"]).values():
        assert ltp.payoff(null, shares).pooled_ratio == pytest.approx(1.0)
    # A config 2x faster everywhere, parts of different speeds: no interaction to remove.
    additive = {(k, *p): f * s for k, f in ((OFF, 1.0), (MTP3, 2.0)) for p, s in zip(PARTS, (1.0, 3.0, 5.0, 7.0))}
    assert ltp.without_interaction(additive) == pytest.approx(additive)
    with pytest.raises(ValueError, match="every config measured on every part"):
        ltp.without_interaction({k: v for k, v in additive.items() if k != (OFF, *S512)})


def test_bands_call_a_real_interaction_beyond_noise_and_a_tiny_one_not():
    mixes = ltp.default_mixes(["out128", "out512"], [0.5])
    noise = PooledNoise(sd=0.02, df=20)
    strong = _rates(_landscape())
    observed = {m: ltp.payoff(strong, s) for m, s in mixes.items()}
    got = ltp.bands(strong, mixes, observed, noise, draws=60, rng=np.random.default_rng(0))["greedy 0.5"]["pooled"]
    assert got["p_no_interaction"] < 0.05 and got["band"][0] < 4 / 3 < got["band"][1] and got["band"][1] < 1.5
    # MTP-3 1 % faster greedy and 1 % slower sampled: a 0.5 % table gain, inside 2 % run noise.
    weak = _rates(_landscape(mtp_greedy=101.0, mtp_sampled=99.0))
    observed = {m: ltp.payoff(weak, s) for m, s in mixes.items()}
    assert observed["greedy 0.5"].pooled_ratio > 1.0
    got = ltp.bands(weak, mixes, observed, noise, draws=60, rng=np.random.default_rng(0))["greedy 0.5"]["pooled"]
    assert got["p_no_interaction"] > 0.05


def test_the_run_writes_the_prediction_with_its_noise_and_provenance(tmp_path, capsys):
    land = tmp_path / "landscape.json"
    land.write_text(json.dumps(_repeats()))
    assert ltp.main(["--landscape", str(land), "--noise-pairs", "mtp-off|out512|", "--draws", "5", "--out-dir", str(tmp_path),
                     "--name", "p"]) == 0
    out = json.loads((tmp_path / "p.json").read_text())
    assert len(out["rows"]) == 2 * 1 * 3  # agreement levels x concurrencies x default mixes
    row = next(r for r in out["rows"] if r["agreement"] == 0.9 and r["mix"] == "greedy 0.5")
    assert row["pooled"]["ratio"] == pytest.approx(4 / 3) and row["single"]["config"] == OFF
    assert out["noise"]["df"] == 2 and out["provenance"]["landscape_sha256"]
    md = (tmp_path / "p.md").read_text()
    assert "not a served measurement" in md and "1.333x" in md
    assert "next:" in capsys.readouterr().out
