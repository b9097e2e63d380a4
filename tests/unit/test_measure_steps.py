"""The order an engine runs a sweep's measurements in: the burn-in once per sampling temperature, then
every bucket's points."""
from __future__ import annotations

from tuning.buckets import make_buckets


def test_the_burn_in_runs_once_per_sampling_temperature():
    """Measured at two temperatures, the burn-in runs the first bucket once at each (the first sampled run
    of a fresh engine pays its own one-time cost), before anything measured; without it, only the points."""
    from tuning.sweep.measure import measure_steps

    buckets = make_buckets([128, 512], input_len=64, concurrency_levels=(4, 8), num_prompts=4, temperatures=(0.0, 0.8))
    steps = [(b.name, c, t, measured) for b, c, t, measured in measure_steps(buckets, burn_in=True)]
    assert steps[:2] == [("le128", 4, 0.0, False), ("le128", 4, 0.8, False)]
    assert all(m for *_, m in steps[2:]) and len(steps) == 2 + 2 * 2 * 2
    assert [s for s in measure_steps(buckets, burn_in=False)] == [
        (b, c, t, True) for b in buckets for c, t in b.points()]


def test_the_burn_in_repeats_until_it_has_lasted_its_seconds():
    """The burn-in runs as a whole again until ``seconds`` have passed since it began (the clock read as
    the runs go), then the measured points once; without seconds it runs once."""
    from tuning.sweep.measure import burn_in_until, measure_steps

    buckets = make_buckets([128, 512], input_len=64, concurrency_levels=(4,), num_prompts=4, temperatures=(0.0, 0.8))
    steps = measure_steps(buckets, burn_in=True)
    burn, measured = steps[:2], steps[2:]
    now = [0.0]

    def clock() -> float:
        return now[0]

    ran = []
    for step in burn_in_until(steps, 25.0, clock=clock):
        ran.append(step)
        now[0] += 5.0  # every run takes 5 s: three passes of two runs reach 30 s >= 25
    assert ran == burn * 3 + measured
    assert list(burn_in_until(steps, 0.0, clock=clock)) == steps
    plain = measure_steps(buckets, burn_in=False)
    assert list(burn_in_until(plain, 100.0, clock=clock)) == plain  # nothing to repeat: no wait
