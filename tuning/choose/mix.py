"""What a mixed workload would sustain, predicted from measured figures: one config for every part of
the mix, or the routing table's config per part.

Why: a routing table runs one engine per distinct config. Whether that beats the best single config
everywhere is what a user wants to know before deploying it, and the sweep's figures already bound
how much it can (on one H200 the prediction was 1.08x and serving measured 1.02x: docs/results.md).

The prediction is the time to serve each part's share of the output tokens at that part's measured
rate: ``total tokens / sum_p(tokens_p / throughput_p)``. It ignores what mixing does inside one engine
(short requests' prefills landing between long requests' decode steps) and how a deployment spreads
load over its engines, so it is an estimate of a ratio, not a measurement of one. A part is a bucket
(:func:`predict`) or a bucket x sampling band x load level (:func:`predict_mix`).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from orchestrator.errors import ConfigError
from orchestrator.table import RoutingTable
from tuning.buckets import Bucket
from tuning.choose.cells import BucketChoice, CellMeasurement
from tuning.results import successful_primary_rows

__all__ = ["MixedPrediction", "bucket_prompts", "bucket_tokens", "mix_parts", "mixed_throughput", "part_rates",
           "per_config_throughput", "predict", "predict_for_table", "predict_mix"]


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
    or per bucket x sampling band with cells, :func:`tuning.choose.mix.predict_mix`) and with each single
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


def mix_parts(token_shares: Mapping[tuple[str, str], float],
              in_flight: int | Mapping[int, float]) -> dict[tuple[str, str, int], float]:
    """The mix's share of the output tokens on each (bucket, band, load level): ``token_shares`` per
    (bucket, band) spread over the load levels ``in_flight`` (one level, or level -> share)."""
    loads = {int(in_flight): 1.0} if isinstance(in_flight, int) else {int(k): float(v) for k, v in in_flight.items()}
    if not loads or any(v < 0 for v in loads.values()) or sum(loads.values()) <= 0:
        raise ValueError(f"load shares must be >= 0 with a positive sum, got {loads}")
    total_load = sum(loads.values())
    parts = {(b, band, level): s * w / total_load for (b, band), s in token_shares.items() if s > 0
             for level, w in loads.items() if w > 0}
    if not parts:
        raise ValueError("the mix has no output tokens")
    return parts


def part_rates(measurements: Iterable[CellMeasurement]) -> dict[tuple[str, str, str, int], float]:
    """(engine key, bucket, band, level) -> mean output tok/s of one replica, as measured."""
    return {(m.engine_key, m.bucket, m.band, m.in_flight): m.figures().output_throughput for m in measurements}


def predict_mix(measurements: Sequence[CellMeasurement], choices: Mapping[str, BucketChoice],
                token_shares: Mapping[tuple[str, str], float], *,
                in_flight: int | Mapping[int, float]) -> MixedPrediction:
    """Output tok/s of a mix whose output tokens fall on (bucket, band) in ``token_shares``
    (:meth:`tuning.traffic.TrafficMix.cell_shares` with ``by="tokens"``) and on load levels (in-flight
    requests per replica) in ``in_flight`` (one level, or level -> share of the tokens), served by the
    chosen cells (``per_bucket_throughput``) and by every single config measured on every part of the mix
    (:func:`tuning.choose.mix.mixed_throughput` over bucket x band x level instead of buckets). Per replica, as
    if every part had engines of its own in proportion to its work (:mod:`tuning.choose.replicas` sizes whole
    replicas on a fixed number of GPUs)."""
    shares = mix_parts(token_shares, in_flight)
    rate = part_rates(measurements)
    parts = list(shares)
    missing = [p for p in parts if p[0] not in choices]
    if missing:
        raise ValueError(f"no choice for bucket(s) of the mix: {sorted({b for b, _, _ in missing})}")
    tokens = {_part(*p): v for p, v in shares.items()}

    def rates(key_of: Any) -> dict[str, float]:
        """Tok/s of each part of the mix served by ``key_of(bucket, band, level)``, where measured."""
        out = {}
        for b, band, level in parts:
            r = rate.get((key_of(b, band, level), b, band, level))
            if r:
                out[_part(b, band, level)] = r
        return out

    table = rates(lambda b, band, level: choices[b].key_for(band, level))
    if len(table) < len(parts):
        unmeasured = sorted(set(tokens) - set(table))
        raise ValueError(f"the table's configs were not all measured on the mix's parts: {', '.join(unmeasured)}")
    keys = sorted({k for k, _, _, _ in rate})
    singles = [(k, mixed_throughput(r, tokens)) for k in keys
               if len(r := rates(lambda b, band, level, k=k: k)) == len(parts)]
    return MixedPrediction(tokens=tokens, per_bucket_throughput=mixed_throughput(table, tokens),
                           singles=tuple(sorted(singles, key=lambda kv: -kv[1])))


def _part(bucket: str, band: str, level: int) -> str:
    return f"{bucket}/{band}@{level}"
