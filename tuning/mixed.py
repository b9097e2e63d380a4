"""What a mixed workload would sustain, predicted from per-bucket figures: one config for every
bucket, or the routing table's config per bucket.

Why: a routing table runs one engine per distinct config. Whether that beats the best single config
everywhere is what a user wants to know before deploying it, and the sweep's figures already bound
how much it can (on one H200 the prediction was 1.08x and serving measured 1.02x: docs/results.md).

The prediction is the time to serve each bucket's share of the output tokens at that bucket's
measured rate: ``total tokens / sum_b(tokens_b / throughput_b)``. It ignores what mixing does inside
one engine (short requests' prefills landing between long requests' decode steps) and how a deployment
spreads load over its engines, so it is an estimate of a ratio, not a measurement of one.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from orchestrator.errors import ConfigError
from orchestrator.table import RoutingTable
from tuning.buckets import Bucket
from tuning.results import successful_primary_rows

__all__ = ["MixedPrediction", "bucket_prompts", "bucket_tokens", "mixed_throughput", "per_config_throughput", "predict",
           "predict_for_table"]


def mixed_throughput(throughput: Mapping[str, float], tokens: Mapping[str, float]) -> float:
    """Output tok/s of the mix ``tokens`` (output tokens per bucket) at ``throughput`` (tok/s per bucket)."""
    total = sum(tokens.values())
    if total <= 0:
        raise ConfigError(f"a mixed workload needs output tokens, got {dict(tokens)}")
    missing = [b for b, n in tokens.items() if n > 0 and not throughput.get(b)]
    if missing:
        raise ConfigError(f"no throughput for bucket(s) {missing} of the mix")
    return total / sum(n / throughput[b] for b, n in tokens.items() if n > 0)


def per_config_throughput(results: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Engine key -> bucket -> mean output tok/s over the successful primary-load rows of a sweep's
    results (several rows per config and bucket when a config was measured again or repeated)."""
    ok = successful_primary_rows(results)
    ok = ok[ok["output_throughput"] > 0]
    out: dict[str, dict[str, float]] = {}
    for (key, bucket), g in ok.groupby(["engine_key", "bucket"]):
        out.setdefault(str(key), {})[str(bucket)] = float(g["output_throughput"].mean())
    return out


def bucket_tokens(results: pd.DataFrame, prompts: Mapping[str, int]) -> dict[str, float]:
    """Output tokens of each bucket's own workload once (``prompts[bucket]`` requests x the tokens a
    request of it produced, output over request throughput in its successful rows): the mix "buckets
    in proportion" when every bucket's workload stands for its share of the traffic. Buckets without
    such rows are left out."""
    ok = successful_primary_rows(results)
    out = {}
    for name, n in prompts.items():
        rows = ok[(ok["bucket"] == name) & (ok["request_throughput"].fillna(0) > 0)]
        if rows.empty:
            continue
        per_request = float((rows["output_throughput"] / rows["request_throughput"]).median())
        out[name] = int(n) * per_request
    return out


def bucket_prompts(buckets: Sequence[Bucket]) -> dict[str, int]:
    """Requests per bucket in the mix: each bucket's measured workload once."""
    return {b.name: b.workload.num_prompts for b in buckets}


@dataclass(frozen=True)
class MixedPrediction:
    """The mix's predicted throughput with the table's configs (``per_bucket_throughput``: one per bucket,
    or per bucket x sampling band with cells, :func:`tuning.cells.predict_mix`) and with each single
    config measured on every part of the mix, best first. ``tokens``: the mix's output tokens per part."""

    tokens: Mapping[str, float]
    per_bucket_throughput: float
    singles: tuple[tuple[str, float], ...] = field(default_factory=tuple)
    """(engine key, predicted mixed tok/s), best first."""

    @property
    def best_single(self) -> tuple[str, float] | None:
        return self.singles[0] if self.singles else None

    @property
    def ratio(self) -> float | None:
        """Per-bucket configs over the best single config (``None`` without a single candidate)."""
        best = self.best_single
        return self.per_bucket_throughput / best[1] if best else None


def predict(per_config: Mapping[str, Mapping[str, float]], tokens: Mapping[str, float],
            per_bucket: Mapping[str, float] | None = None) -> MixedPrediction:
    """Predict the mix ``tokens`` served by ``per_bucket`` (tok/s per bucket, e.g. a routing table's
    figures; default: the best measured config of each bucket, i.e. what no table can beat on these
    figures) and by every config of ``per_config`` that was measured on all of the mix's buckets."""
    buckets = [b for b, n in tokens.items() if n > 0]
    if per_bucket is None:
        per_bucket = {b: max((t[b] for t in per_config.values() if t.get(b)), default=0.0) for b in buckets}
    singles = sorted(((key, mixed_throughput(t, tokens)) for key, t in per_config.items()
                      if all(t.get(b) for b in buckets)), key=lambda kv: -kv[1])
    return MixedPrediction(tokens=dict(tokens), per_bucket_throughput=mixed_throughput(per_bucket, tokens),
                           singles=tuple(singles))


def predict_for_table(table: RoutingTable, results: pd.DataFrame) -> MixedPrediction | None:
    """The routing table against every single config of the sweep that made it, on its buckets in
    proportion (each bucket's workload once, as recorded in the table); ``None`` when the results do
    not cover every bucket or no config was measured on all of them."""
    prompts = {b.name: int(b.workload.get("num_prompts") or 0) for b in table.buckets}
    if results.empty or not all(prompts.values()):
        return None
    tokens = bucket_tokens(results, prompts)
    if set(tokens) != set(prompts):
        return None
    per_config = per_config_throughput(results)
    per_bucket = {b.name: per_config.get(b.engine_config().key(), {}).get(b.name) or b.figures.output_throughput
                  for b in table.buckets}
    pred = predict(per_config, tokens, per_bucket)
    return pred if pred.best_single is not None else None
