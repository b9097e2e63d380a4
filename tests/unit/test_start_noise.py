"""The variation between engine starts (:class:`tuning.stats.PooledNoise` ``start_sd``): estimated where a
config was measured on one cell by several starts, carried by every comparison, and what it does to a
sweep's choices (:func:`tuning.choose.noise.pooled_noise`, :func:`tuning.choose.cells.cell_measurements`,
:func:`tuning.choose.cells.choose_cells`)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from orchestrator.config import Backend, EngineConfig
from tests.bench_results import bench_result
from tuning.buckets import make_buckets
from tuning.choose.cells import CellMeasurement, cell_measurements, choose_cells
from tuning.choose.noise import pooled_noise
from tuning.results import is_cached_copy, results_frame, rows_for_trial
from tuning.stats import PooledNoise, effective_starts


def _draw(rng: np.random.Generator, sd: float, start_sd: float, measurements: int, starts: int,
          rounds: int) -> list[list[list[float]]]:
    """``measurements`` configs x cells, each ``starts`` engine starts of ``rounds`` rounds: every start
    shifts its rounds by one log-normal draw of ``start_sd``, every round by one of ``sd``."""
    out = []
    for _ in range(measurements):
        level = rng.uniform(5, 9)  # each measurement its own true throughput (log)
        out.append([[math.exp(level + shift + e) for e in rng.normal(0, sd, rounds)]
                    for shift in rng.normal(0, start_sd, starts)])
    return out


@pytest.mark.parametrize("starts, rounds", [(2, 4), (3, 2), (4, 8)])
def test_both_levels_are_recovered_from_many_measurements(starts, rounds):
    rng = np.random.default_rng(starts * 10 + rounds)
    noise = PooledNoise.of_starts(_draw(rng, sd=0.10, start_sd=0.06, measurements=400, starts=starts, rounds=rounds))
    assert noise is not None
    assert noise.df == 400 * starts * (rounds - 1) and noise.start_df == 400 * (starts - 1)
    assert noise.sd == pytest.approx(0.10, rel=0.05)
    assert noise.start_sd == pytest.approx(0.06, rel=0.15)


def test_no_start_variation_estimates_near_zero_and_never_below():
    rng = np.random.default_rng(1)
    noise = PooledNoise.of_starts(_draw(rng, sd=0.10, start_sd=0.0, measurements=400, starts=2, rounds=4))
    assert noise is not None and noise.start_df == 400
    assert 0.0 <= noise.start_sd < 0.02
    # between-start spread below what the rounds alone put there: clipped at 0, not an imaginary sd
    tight = PooledNoise.of_starts([[[100.0, 120.0], [100.0, 120.0]]])
    assert tight is not None and tight.start_sd == 0.0 and tight.start_df == 1


def test_one_start_per_measurement_leaves_the_start_variation_unknown():
    noise = PooledNoise.of([[100.0, 110.0], [200.0, 190.0, 205.0]])
    assert noise is not None and noise.start_sd == 0.0 and noise.start_df == 0
    assert noise == PooledNoise.of_starts([[[100.0, 110.0]], [[200.0, 190.0, 205.0]]])
    assert "engine start" not in noise.describe()
    assert PooledNoise.of_starts([[[100.0], [120.0]]]) is None  # starts of one round each: no round spread


def test_a_start_of_one_round_still_counts_between_starts():
    """Single-round starts have no spread of their own, but their means still differ by the start's luck."""
    noise = PooledNoise.of_starts([[[100.0, 102.0, 98.0], [150.0]], [[50.0, 51.0], [49.0, 50.5]]])
    assert noise is not None and noise.df == 2 + 1 + 1 and noise.start_df == 2 and noise.start_sd > 0.1


def test_start_variation_widens_a_comparison_and_more_starts_narrow_it():
    a, b = [1100.0, 1150.0, 1120.0, 1130.0], [1000.0, 1020.0, 990.0, 1010.0]
    rounds_only = PooledNoise(sd=0.03, df=30)
    with_starts = PooledNoise(sd=0.03, df=30, start_sd=0.08, start_df=6)
    r0, low0, high0 = rounds_only.ratio_interval(a, b)
    r1, low1, high1 = with_starts.ratio_interval(a, b)
    r4, low4, high4 = with_starts.ratio_interval(a, b, starts=(4.0, 4.0))
    assert r0 == r1 == r4
    assert low1 < low4 < low0 and high0 < high4 < high1
    assert rounds_only.different(a, b) and not with_starts.different(a, b)
    with pytest.raises(ValueError, match="starts"):
        with_starts.ratio_interval(a, b, starts=(0.5, 1.0))
    assert "an engine start shifts its rounds by 8.3%" in with_starts.describe()


def test_effective_starts_weighs_each_start_by_its_rounds():
    assert effective_starts([4]) == 1.0
    assert effective_starts([4, 4]) == 2.0
    assert effective_starts([2, 8]) == pytest.approx(100 / 68)  # the 8-round start dominates the mean
    with pytest.raises(ValueError):
        effective_starts([])
    with pytest.raises(ValueError):
        effective_starts([3, 0])


def test_more_rounds_on_one_start_cannot_separate_a_gap_within_the_start_variation():
    noise = PooledNoise(sd=0.10, df=40, start_sd=0.05, start_df=20, start_rounds=4)
    assert noise.rounds_to_separate(0.9) is None  # 2 x 0.05^2 per start pair alone hides a 0.9x gap at 80 %
    assert noise.rounds_to_separate(0.9, starts=4) is None  # the starts' 5 % still too much at 4 a config
    n = noise.rounds_to_separate(0.9, starts=16)
    assert n is not None and n >= 2
    assert PooledNoise(sd=0.10, df=40).rounds_to_separate(0.9) < n  # start variation costs rounds too
    with pytest.raises(ValueError, match="starts"):
        noise.rounds_to_separate(0.9, starts=0.0)


def test_rounds_by_start_and_cached_copies(tmp_path):
    """Rows of two trials of one config are two starts; a cached copy of a trial's rows is the same
    measurement, neither a second start nor more rounds."""
    b = make_buckets((1024,), input_len=256, concurrency_levels=(64,), num_prompts=64, temperatures=(0.0,))[0]
    cfg = EngineConfig(backend=Backend.SIM, model="intern-s2-preview-8xh200", tp=8)
    key = b.measurement_key(64, 0.0)

    def rows(trial: str, runs: list[float]) -> list[dict]:
        return rows_for_trial(sweep_id="s", trial_id=trial, role="static", config=cfg, buckets=[b],
                              measurements={key: bench_result(runs)})

    first, again = rows("t1", [1000.0, 1100.0]), rows("t2", [900.0, 950.0, 920.0])
    copy = [{**r, "trial_id": "t3", "cached": True, "cached_from_trial": "t1"} for r in first]
    assert is_cached_copy(copy[0]) and not is_cached_copy(first[0])
    assert is_cached_copy({"cached": "True"}) and not is_cached_copy({"cached": "False"})  # as a CSV reads back
    assert not is_cached_copy({"cached": float("nan")}) and not is_cached_copy({})
    df = results_frame([*first, *again, *copy])
    (m,) = cell_measurements(df, b)
    assert sorted(m.throughputs) == [900.0, 920.0, 950.0, 1000.0, 1100.0]
    assert sorted(m.rounds_per_start) == [2, 3] and m.starts == pytest.approx(25 / 13)
    noise = pooled_noise(df)
    assert noise is not None and noise.df == 1 + 2 and noise.start_df == 1
    assert noise == PooledNoise.of_starts([[[1000.0, 1100.0], [900.0, 950.0, 920.0]]])
    # read back from results.csv, as resumed sweeps and the benchmarks read it: the same noise
    path = tmp_path / "results.csv"
    df.to_csv(path, index=False)
    assert pooled_noise(pd.read_csv(path)) == noise


def test_a_cell_shown_on_one_start_each_is_not_shown_once_starts_vary():
    """The same measurements: at the rounds' noise alone the sampled cell gets MTP off; where the sweep
    measured engine starts 8 % apart, a 10 % gap on one start each is within noise, kept and undecided."""
    off = {"backend": "sim", "model": "m", "tp": 1}
    mtp = {**off, "speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": 4}

    def m(cfg: dict, band: str, tputs: list[float]) -> CellMeasurement:
        return CellMeasurement(config=cfg, bucket="le1024", band=band, in_flight=64, throughputs=tuple(tputs))

    measured = [m(mtp, "greedy", [1500, 1520, 1490, 1510]), m(off, "greedy", [1000, 1010, 990, 1005]),
                m(mtp, "sampled", [1000, 1010, 995, 1005]), m(off, "sampled", [1100, 1110, 1095, 1105])]
    key_off = EngineConfig.from_dict(off).key()

    def choose(noise: PooledNoise):
        return choose_cells(measured, primary_band="greedy", primary_in_flight=64, noise=noise)["le1024"]

    plain = choose(PooledNoise(sd=0.01, df=12))
    assert [c.engine_config().key() for c in plain.cells] == [key_off] and plain.undecided == ()
    starts_vary = choose(PooledNoise(sd=0.01, df=12, start_sd=0.08, start_df=4))
    assert starts_vary.cells == () and [u.other_key for u in starts_vary.undecided] == [key_off]
    assert any("rounds over several starts would" in n for n in starts_vary.notes)


def test_start_contrasts_are_counted_per_config_when_the_caller_says_so():
    """Two configs, each started twice, measured on four cells: eight per-cell start differences, but if
    a start shifts all its cells alike only two independent ones."""
    rng = np.random.default_rng(3)
    measurements = [m for _ in range(2) for m in _draw(rng, sd=0.1, start_sd=0.05, measurements=4, starts=2, rounds=2)]
    assert PooledNoise.of_starts(measurements).start_df == 8
    capped = PooledNoise.of_starts(measurements, contrasts=2)
    assert capped.start_df == 2 and capped.start_sd == PooledNoise.of_starts(measurements).start_sd


def test_equal_configs_are_called_different_about_as_often_as_the_level_says():
    """A sweep's layout (two configs, four cells, three engine starts of three rounds each, a start
    shifting all of its cells alike), both configs equal, 5 % start variation: the 95 % comparison on one
    cell calls them different in at most about 5 % of sweeps (fewer: the degrees of freedom counted per
    config and Satterthwaite's approximation err on the safe side; ~2 % here, as at no start variation).
    With the start variation left out it calls them different in ~13 %: the reason it is carried."""
    rng = np.random.default_rng(0)
    sweeps, shown, shown_ignoring = 1500, 0, 0
    for _ in range(sweeps):
        per_config = []
        for _config in range(2):
            shifts = rng.normal(0, 0.05, 3)  # one per engine start, all its cells alike
            per_config.append([[[math.exp(7 + s + e) for e in rng.normal(0, 0.1, 3)] for s in shifts]
                               for _cell in range(4)])
        noise = PooledNoise.of_starts([m for c in per_config for m in c], contrasts=2 * 2)
        a = [x for start in per_config[0][0] for x in start]
        b = [x for start in per_config[1][0] for x in start]
        shown += noise.different(a, b, starts=(3.0, 3.0))
        shown_ignoring += PooledNoise(noise.sd, noise.df).different(a, b)
    assert 0.005 < shown / sweeps < 0.065
    assert shown_ignoring / sweeps > 0.10


@pytest.mark.parametrize("noise", [PooledNoise(0.10, 20, 0.05, 4, 3.0), PooledNoise(0.10, 40, 0.02, 1, 4.0),
                                   PooledNoise(0.08, 30, 0.04, 6, 2.0)])
@pytest.mark.parametrize("ratio", [0.7, 0.85, 1.3])
def test_the_rounds_to_separate_are_the_first_that_do_with_start_variation(noise, ratio):
    """The criterion is not monotone in n when the degrees of freedom move with it: the answer is the
    first n that meets it, found however far the search must go."""
    from tuning.stats import t_quantile

    def separates(n: int, starts: float) -> bool:
        df = noise._df(2 / n, 2 / starts)
        k = t_quantile(0.975, df) + t_quantile(0.8, df)
        return abs(math.log(ratio)) >= k * math.sqrt(noise.sd ** 2 * 2 / n + noise.start_sd ** 2 * 2 / starts)

    for starts in (1.0, 4.0, 16.0):
        want = next((n for n in range(2, 301) if separates(n, starts)), None)
        assert noise.rounds_to_separate(ratio, max_rounds=300, starts=starts) == want
