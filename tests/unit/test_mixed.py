"""The mixed-workload prediction (:mod:`tuning.choose.mix`): hand-computed figures, and the line the sweep
prints from a real results frame."""
from __future__ import annotations

import pandas as pd
import pytest

from tuning.buckets import make_buckets
from tuning.choose.mix import (
    bucket_prompts,
    bucket_tokens,
    mixed_throughput,
    per_config_throughput,
    predict,
)


def test_mixed_throughput_is_total_tokens_over_the_time_each_bucket_takes():
    # 100 tokens at 10 tok/s (10 s) + 300 at 30 tok/s (10 s): 400 tokens in 20 s.
    assert mixed_throughput({"a": 10.0, "b": 30.0}, {"a": 100, "b": 300}) == pytest.approx(20.0)
    # A bucket with no tokens in the mix needs no figure.
    assert mixed_throughput({"a": 10.0}, {"a": 100, "b": 0}) == pytest.approx(10.0)
    with pytest.raises(ValueError, match="no throughput for bucket"):
        mixed_throughput({"a": 10.0}, {"a": 100, "b": 300})
    with pytest.raises(ValueError, match="needs output tokens"):
        mixed_throughput({"a": 10.0}, {"a": 0})


def test_per_bucket_best_against_the_best_single_config():
    per_config = {
        "short": {"a": 20.0, "b": 10.0},   # best at a
        "long": {"a": 10.0, "b": 40.0},    # best at b
        "flat": {"a": 15.0, "b": 30.0},
    }
    tokens = {"a": 100, "b": 400}
    pred = predict(per_config, tokens)
    # Per bucket best: a at 20 (5 s), b at 40 (10 s) -> 500 / 15 s.
    assert pred.per_bucket_throughput == pytest.approx(500 / 15)
    # Singles: long 100/10 + 400/40 = 20 s -> 25; flat 100/15 + 400/30 = 20 s -> 25; short 5 + 40 = 45 s.
    assert pred.singles[-1][0] == "short"
    assert {k for k, _ in pred.singles} == {"short", "long", "flat"}
    assert pred.best_single[1] == pytest.approx(25.0)
    assert pred.ratio == pytest.approx((500 / 15) / 25.0)
    # A table's own figures instead of the per-bucket best (e.g. a config chosen to fit the GPUs).
    assert predict(per_config, tokens, {"a": 15.0, "b": 30.0}).ratio == pytest.approx(1.0)
    # A config measured on one bucket only can serve that bucket, but is no single candidate.
    with_partial = predict({**per_config, "partial": {"a": 100.0}}, tokens)
    assert with_partial.per_bucket_throughput == pytest.approx(500 / (1 + 10))
    assert "partial" not in dict(with_partial.singles)
    assert predict({"partial": {"a": 1.0}}, tokens, {"a": 1.0, "b": 1.0}).ratio is None


def test_figures_and_token_shares_come_from_the_successful_primary_rows():
    buckets = make_buckets((256, 2048), num_prompts=64)
    rows = [
        # config x: two runs at le256 (averaged), one at le2048; a failed and a load-variant row ignored
        dict(engine_key="x", bucket="le256", status="ok", primary_load=True, output_throughput=100.0, request_throughput=0.5),
        dict(engine_key="x", bucket="le256", status="ok", primary_load=True, output_throughput=300.0, request_throughput=1.5),
        dict(engine_key="x", bucket="le2048", status="ok", primary_load=True, output_throughput=1000.0, request_throughput=0.625),
        dict(engine_key="x", bucket="le2048", status="ok", primary_load=False, output_throughput=9e9, request_throughput=1.0),
        dict(engine_key="y", bucket="le2048", status="failed", primary_load=True, output_throughput=9e9, request_throughput=1.0),
    ]
    df = pd.DataFrame(rows)
    assert per_config_throughput(df) == {"x": {"le256": 200.0, "le2048": 1000.0}}
    # 200 tokens per request at le256, 1600 at le2048; 64 prompts each.
    assert bucket_tokens(df, bucket_prompts(buckets)) == {"le256": 64 * 200.0, "le2048": 64 * 1600.0}
