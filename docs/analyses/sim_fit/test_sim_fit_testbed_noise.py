"""The testbed-noise analysis (``docs/analyses/sim_fit/sim_fit_testbed_noise.py``) on synthetic data whose answer is known:
noise recovered from level differences, the model's own error near 0 when there is none and at its size when
there is, a shifted cell type flagged and the others not, and the statistics against known values."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from docs.analyses.sim_fit import sim_fit_testbed_noise as noise
from tuning.stats import t_quantile

ROOT = Path(__file__).resolve().parents[3]


def _cell(i: int, output_len: int, concurrency: int, draft_tokens: int, lease: int, error: float) -> noise.Cell:
    return noise.Cell(key=f"k{i}", name=f"n{i}", engine="e", draft_tokens=draft_tokens, agreement=0.9,
                      output_len=output_len, concurrency=concurrency, temperature=0.0, lease=lease, held_out=True,
                      measured=1000.0, simulated=1000.0 * math.exp(error), duration_s=5.0)


def _held_out(shift_o512_c64: float, own: float, *, per_type: int = 150, seed: int = 3) -> list[noise.Cell]:
    """Held-out cells in the six cell types with per-type noise (0.15 / 0.10), the model's own error ``own`` and a
    bias in o512 c64."""
    rng = np.random.default_rng(seed)
    sd = {128: 0.15, 512: 0.10}
    out = []
    for o, c, n_draft in [(128, 4, 1), (128, 64, 3), (512, 4, 1), (512, 64, 3), (128, 16, 2), (512, 16, 2)]:
        for _ in range(per_type):
            e = rng.normal(0.0, math.hypot(sd[o], own)) + (shift_o512_c64 if (o, c) == (512, 64) else 0.0)
            out.append(_cell(len(out), o, c, n_draft, int(rng.integers(2, 4)), e))
    return out


NOISE = noise.LeaseNoise(sd={128: 0.15, 512: 0.10}, lease1_extra=0.0, shifts=(0.0, 0.0), nll=0.0)
OFFSETS: dict = {}  # no level/protocol offsets: centred errors equal raw ones


@pytest.mark.parametrize("df", [3, 10, 40, 139])
def test_t_p_matches_the_quantile(df: int) -> None:
    assert noise.t_two_sided_p(t_quantile(0.975, df), df) == pytest.approx(0.05, abs=2e-4)
    assert noise.t_two_sided_p(0.0, df) == pytest.approx(1.0)
    crit = noise.t_critical(0.95, df)  # the interval's quantile inverts the same CDF as the p-value
    assert noise.t_two_sided_p(crit, df) == pytest.approx(0.05, abs=1e-9)
    tabled = {3: 3.182446, 10: 2.228139, 40: 2.021075, 139: 1.977178}  # scipy.stats.t.ppf(0.975, df)
    assert crit == pytest.approx(tabled[df], abs=2e-5)


@pytest.mark.parametrize(("t", "df", "p"), [
    (2.0, 10, 0.073388),                                # scipy.stats.t.sf(2, 10) * 2
    (2.0, 1, 1 - 2 / math.pi * math.atan(2.0)),         # Cauchy: 0.295167
    (2.0, 2, 1 - 2.0 / math.sqrt(6.0)),                 # df 2 closed form: 0.183503
    (2.228139, 10, 0.05),                               # the tabled 97.5 % point
])
def test_t_p_exact_values(t: float, df: int, p: float) -> None:
    assert noise.t_two_sided_p(t, df) == pytest.approx(p, abs=2e-6)
    assert noise.t_two_sided_p(-t, df) == pytest.approx(p, abs=2e-6)


def test_f_tail_exact_values() -> None:
    assert noise.f_sf(1.0, 1, 1) == pytest.approx(0.5)
    assert noise.f_sf(2.866, 3, 36) == pytest.approx(0.05, abs=1e-3)  # the tabled 95 % point of F(3, 36)


def test_group_interval_and_p_agree() -> None:
    """One t source: the interval excludes 0 exactly when p < 0.05."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        e = rng.normal(rng.normal(0.0, 0.05), 0.1, 12)
        g = noise.group_stats("x", e, [0.01] * 12, 0)
        assert (g.mean_interval[0] > 0 or g.mean_interval[1] < 0) == (g.t_p < 0.05)


def test_chi2_tail_wilson_hilferty() -> None:
    assert noise.chi2_sf(26.0, 26) == pytest.approx(0.46, abs=0.01)  # scipy: 0.4633
    assert noise.chi2_sf(53.0, 26) == pytest.approx(0.0014, abs=5e-4)  # scipy: 0.00135


def test_level_difference_recovers_a_known_sd() -> None:
    """Two levels share each config's misfit (large, 0.3) and a lease shift; their difference gives the noise back."""
    rng = np.random.default_rng(0)
    n = 4000
    types = np.repeat([128, 512], n)
    sd = np.where(types == 128, 0.16, 0.09)
    misfit = rng.normal(0.0, 0.3, 2 * n)
    e_a = misfit + 0.05 + rng.normal(0.0, sd)
    e_b = misfit + rng.normal(0.0, sd)
    got = noise.two_level_sd(e_a, e_b, types)
    assert got[128] == pytest.approx(0.16, rel=0.04)
    assert got[512] == pytest.approx(0.09, rel=0.04)
    assert noise.one_run_sd([0.1, -0.1], centre=False) == pytest.approx(0.1 / math.sqrt(2))


def test_three_leases_recover_sd_extra_and_shifts() -> None:
    rng = np.random.default_rng(1)
    n = 3000
    types = np.repeat([128, 512], n)
    sd = np.where(types == 128, 0.15, 0.10)[:, None]
    misfit = rng.normal(0.0, 0.3, (2 * n, 1))
    E = misfit + np.array([0.10, 0.03, 0.0]) + sd * rng.standard_normal((2 * n, 3))
    E[:, 0] += rng.normal(0.0, 0.08, 2 * n)  # lease 1's extra noise
    fit = noise.fit_lease_noise(E, types)
    assert fit.sd[128] == pytest.approx(0.15, abs=0.006)
    assert fit.sd[512] == pytest.approx(0.10, abs=0.006)
    assert fit.lease1_extra == pytest.approx(0.08, abs=0.012)
    assert fit.shifts[0] == pytest.approx(0.10, abs=0.01) and fit.shifts[1] == pytest.approx(0.03, abs=0.01)


def test_contrast_likelihood_matches_a_direct_computation() -> None:
    """Lease 3's run is in both contrasts, so they covary by its variance; the shifts are the GLS optimum."""
    rng = np.random.default_rng(2)
    E = rng.normal(0.0, 0.2, (7, 3))
    types = np.array([128, 128, 128, 512, 512, 512, 512])
    sd, extra = {128: 0.14, 512: 0.09}, 0.06
    nll, mu = noise._lease_nll(sd, extra, noise._contrast_stats(E, types))

    def direct(m: np.ndarray) -> float:
        total = 0.0
        for row, t in zip(E, types):
            v = sd[int(t)] ** 2
            cov = np.array([[2 * v + extra ** 2, v], [v, 2 * v]])
            r = row[:2] - row[2] - m
            total += 0.5 * (math.log(np.linalg.det(2 * math.pi * cov)) + r @ np.linalg.solve(cov, r))
        return total
    assert nll == pytest.approx(direct(np.array(mu)), rel=1e-9)
    for step in ([0.01, 0.0], [0.0, -0.01]):
        assert direct(np.array(mu) + step) > nll


def test_exact_model_has_no_own_error_and_no_flag() -> None:
    cells = _held_out(0.0, 0.0)
    types = noise.decompose(cells, NOISE, OFFSETS, centre=False, groups=noise.CELL_TYPES)
    assert len(types) == 6 and sum(g.n for g in types) == len(cells)
    assert noise.flag_biased(types) == []
    (all_cells,) = noise.decompose(cells, NOISE, OFFSETS, centre=False, groups=noise.OTHER_GROUPS[:1])
    assert all_cells.own < 0.03
    assert all_cells.chi2_p > 0.01
    assert all_cells.passes == pytest.approx(all_cells.expected_passes, rel=0.12)


def test_shifted_type_is_flagged_and_own_error_found() -> None:
    cells = _held_out(-0.1, 0.0)
    types = noise.decompose(cells, NOISE, OFFSETS, centre=False, groups=noise.CELL_TYPES)
    assert noise.flag_biased(types) == ["o512 c64"]
    shifted = next(g for g in types if g.name == "o512 c64")
    assert shifted.mean == pytest.approx(-0.1, abs=0.02)
    assert noise.bar_verdict(shifted) == "fails"
    cells = _held_out(0.0, 0.07, per_type=400)
    (all_cells,) = noise.decompose(cells, NOISE, OFFSETS, centre=False, groups=noise.OTHER_GROUPS[:1])
    assert all_cells.own == pytest.approx(0.07, abs=0.015)
    assert all_cells.chi2_p < 0.001


def test_centring_removes_a_level_offset() -> None:
    cells = [c if c.lease != 3 else noise.Cell(**{**c.__dict__, "simulated": c.simulated * math.exp(0.2)})
             for c in _held_out(0.0, 0.0)]
    raw = noise.decompose(cells, NOISE, OFFSETS, centre=False, groups=noise.CELL_TYPES)
    centred = noise.decompose(cells, NOISE, {(3, True): 0.2}, centre=True, groups=noise.CELL_TYPES)
    assert len(noise.flag_biased(raw)) >= 4
    assert noise.flag_biased(centred) == []
    # an MTP-off offset does not touch MTP cells, nor an MTP one MTP-off cells
    off = noise.Cell(**{**cells[0].__dict__, "draft_tokens": 0, "lease": 3})
    assert noise.centred_error(off, {(3, True): 0.2}) == pytest.approx(off.log_error)
    assert noise.centred_error(off, {(3, False): 0.05}) == pytest.approx(off.log_error - 0.05)


def test_level_offsets_come_from_fit_cells_of_the_same_kind() -> None:
    def c(i: int, lease: int, draft: int, held: bool, err: float) -> noise.Cell:
        return noise.Cell(**{**_cell(i, 512, 1, draft, lease, err).__dict__, "held_out": held})
    cells = [c(0, 1, 2, False, 0.10), c(1, 1, 2, False, 0.20), c(2, 1, 0, False, -0.1), c(3, 1, 2, True, 9.0),
             c(4, 2, 1, False, 0.05), c(5, 2, 0, True, 0.3)]
    off = noise.level_offsets(cells)
    assert off == pytest.approx({(1, True): 0.15, (1, False): -0.1, (2, True): 0.05})
    assert (2, False) not in off  # no MTP-off FIT cell in lease 2: no offset, not the MTP cells'
    assert noise.centred_error(cells[5], off) == pytest.approx(0.3)


def test_expected_passes() -> None:
    assert noise.expected_passes([1e-8] * 10) == pytest.approx(10.0)
    assert noise.expected_passes([0.091 ** 2]) == pytest.approx(0.729, abs=0.005)  # band [log 0.9, log 1.1]
    sym = 2 * noise.NormalDist().cdf(math.log(1.1) / 0.0914) - 1  # the earlier write-up's band, ±log 1.1
    assert sym == pytest.approx(0.703, abs=0.001)


def _with(mean: float, interval: tuple[float, float]) -> noise.GroupStats:
    return noise.GroupStats("x", 20, 10, 10.0, mean, interval, 0.01, 0.1, 0.1, 0.0, 1.0, 0.5)


def test_bar_is_symmetric() -> None:
    lo, hi = math.log(0.95), math.log(1.05)
    assert noise.bar_verdict(_with(0.0, (-0.03, 0.03))) == "meets"
    assert noise.bar_verdict(_with(0.0, (lo, hi))) == "meets"  # the edges belong to the band
    assert noise.bar_verdict(_with(0.0, (-0.08, 0.08))) == "undecided"
    # the mean outside the bar, the interval across its edge: the data cannot say (the flagged types today)
    assert noise.bar_verdict(_with(-0.094, (-0.139, -0.049))) == "undecided"
    assert noise.bar_verdict(_with(-0.102, (-0.167, -0.036))) == "undecided"
    assert noise.bar_verdict(_with(0.09, (0.04, 0.14))) == "undecided"
    # wholly outside, either side: fails; touching the edge is not outside
    assert noise.bar_verdict(_with(-0.10, (-0.14, lo - 1e-9))) == "fails"
    assert noise.bar_verdict(_with(0.10, (hi + 1e-9, 0.14))) == "fails"
    assert noise.bar_verdict(_with(-0.10, (-0.14, lo))) == "undecided"


def test_own_error_ml_known_values() -> None:
    """Errors ±e with noise variance v: the ML own error is sqrt(e^2 - v), and 0 where e^2 <= v."""
    assert noise.own_error_ml([0.2, -0.2] * 10, [0.01] * 20) == pytest.approx(math.sqrt(0.03), abs=1e-4)
    assert noise.own_error_ml([0.1, -0.1] * 10, [0.01] * 20) == pytest.approx(0.0, abs=1e-3)
    assert noise.own_error_ml([0.05, -0.05] * 10, [0.01] * 20) == pytest.approx(0.0, abs=1e-4)
    # mixed noise: the two halves' own errors agree only at the ML answer, found from the likelihood, not a formula
    e, v = [0.25, -0.25] * 5 + [0.15, -0.15] * 5, [0.0525] * 10 + [0.0125] * 10
    assert noise.own_error_ml(e, v) == pytest.approx(0.1, abs=1e-4)


def test_bootstrap_keeps_units_whole() -> None:
    configs = [(d, o, t, c) for d in (1, 2) for o in (128, 512) for t in (0.0, 0.8) for c in (1, 4, 16)]
    types = np.array([k[1] for k in configs])
    units = np.array([noise.engine_pass(k) for k in configs])
    seen = []

    def fn(idx: np.ndarray) -> list[float]:
        seen.append(idx)
        return [0.0]
    noise.bootstrap(fn, types, units, 20, np.random.default_rng(0))
    for idx in seen:
        assert sorted(types[idx].tolist()) == sorted(types.tolist())  # each type keeps its count
        labels, counts = np.unique(units[idx], return_counts=True)
        assert set(counts.tolist()) <= {3, 6, 9, 12}  # whole passes of three concurrencies


def test_runs_to_resolve() -> None:
    assert noise.runs_to_resolve(0.05, 0.099) == 16  # 1.96 * 0.099 / 4 = 0.0485 < 0.05
    assert noise.runs_to_resolve(0.01, 0.099) == 377


def _small() -> tuple[dict, dict]:
    def cell(engine: str, agreement: float | None, out: int, temp: float, c: int, thr: float, warm: bool) -> dict:
        return {"engine": engine, "agreement": agreement, "draft_tokens": 0 if agreement is None else 1,
                "output_len": out, "temperature": temp, "concurrency": c, "completed": 4, "failed": 0,
                "output_throughput": thr, "duration_s": 3.0, **({"warmup": "w"} if warm else {})}
    landscape = {"cells": {"mtp-off|out512|T0|c1": cell("mtp-off", None, 512, 0.0, 1, 110.0, True),
                           "mtp-off|out512|T0.8|c1": cell("mtp-off", None, 512, 0.8, 1, 100.0, False),
                           "a0.5-mtp1|out128|T0|c1": cell("a0.5-mtp1", 0.5, 128, 0.0, 1, 200.0, True)},
                 "superseded": {"mtp-off|out512|T0|c1": [cell("mtp-off", None, 512, 0.0, 1, 100.0, False)]}}
    fit = {"measurements": ["benchmarks/results/x/landscape.json"], "tolerances": {"throughput": 0.1},
           "held_out": [{"cell": "mtp-off o512 c1 T0 n4", "held_out": True, "measured_throughput": 110.0, "sim_throughput": 115.5}],
           "fit": [{"cell": "mtp-off o512 c1 T0.8 n4", "held_out": False, "measured_throughput": 100.0, "sim_throughput": 85.0},
                   {"cell": "a0.5-mtp1 o128 c1 T0 n4", "held_out": False, "measured_throughput": 200.0, "sim_throughput": 200.0}]}
    return landscape, fit


def test_join_and_repeats_on_a_small_landscape() -> None:
    landscape, fit = _small()
    cells = {c.key: c for c in noise.join_cells(landscape, fit, "benchmarks/results/x/landscape.json")}
    for k, c in cells.items():  # lease 1 exactly where the warm-up record is missing
        assert (c.lease == 1) == ("warmup" not in landscape["cells"][k])
    assert cells["mtp-off|out512|T0|c1"].log_error == pytest.approx(math.log(1.05))
    assert cells["mtp-off|out512|T0|c1"].passes and not cells["mtp-off|out512|T0.8|c1"].passes
    rep = noise.direct_repeats(landscape)
    assert rep["pairs"] == 1 and rep["groups"][0]["warm"]
    assert rep["groups"][0]["pairs"][0]["log_ratio"] == pytest.approx(math.log(1.1))
    assert rep["groups"][0]["sd_raw"] == pytest.approx(math.log(1.1) / math.sqrt(2))  # one pair: |d| / sqrt 2
    with pytest.raises(noise.NoiseError, match="no record"):
        noise.join_cells(landscape, {"held_out": [], "fit": []})


def test_leases_checked_against_the_warmup_record() -> None:
    landscape, fit = _small()
    redone = {**landscape, "cells": {**landscape["cells"],
                                     "mtp-off|out512|T0.8|c1": {**landscape["cells"]["mtp-off|out512|T0.8|c1"], "warmup": "w"}}}
    with pytest.raises(noise.NoiseError, match="warm-up record"):  # a lease-1 cell measured again, tables not updated
        noise.join_cells(redone, fit)
    cold = {**landscape, "cells": {**landscape["cells"],
                                   "a0.5-mtp1|out128|T0|c1": {k: v for k, v in landscape["cells"]["a0.5-mtp1|out128|T0|c1"].items()
                                                              if k != "warmup"}}}
    with pytest.raises(noise.NoiseError, match="warm-up record"):
        noise.join_cells(cold, fit)


def test_fit_must_name_the_landscape() -> None:
    landscape, fit = _small()
    with pytest.raises(noise.NoiseError, match="do not name"):
        noise.join_cells(landscape, fit, "benchmarks/results/other/landscape.json")
    with pytest.raises(noise.NoiseError, match="judged cells"):
        noise.join_cells(landscape, {**fit, "tolerances": {"throughput": 0.05}}, "benchmarks/results/x/landscape.json")


def test_level_columns_follow_the_lease_table() -> None:
    assert [noise.AGREEMENT_LEASE[a] for a in noise.LEVELS] == sorted(noise.AGREEMENT_LEASE.values())


def test_committed_inputs_give_the_layout() -> None:
    import json
    landscape = json.loads((ROOT / noise.DEFAULT_LANDSCAPE).read_text())
    fit = json.loads((ROOT / noise.DEFAULT_FIT).read_text())
    cells = noise.join_cells(landscape, fit, noise.DEFAULT_LANDSCAPE)
    for c in cells:
        assert (c.lease == 1) == (landscape["cells"][c.key].get("warmup") is None)
    r = noise.analyse(landscape, fit, reps=3, seed=0, draws=0, landscape_path=noise.DEFAULT_LANDSCAPE)
    assert (r["cells"], r["held_out_cells"], r["direct_repeats"]["pairs"], r["near_repeats"]["configs"]) == (260, 140, 15, 80)
    assert sum(g["n"] for g in r["held_out"]["raw"]["types"]) == 140
    assert r["near_repeats"]["bootstrap"]["by_unit"]["engine passes"]["units"] == 16
    lo, hi = r["verdict"]["own_raw_interval"]
    assert lo <= hi
