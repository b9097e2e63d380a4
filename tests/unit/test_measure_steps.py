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
