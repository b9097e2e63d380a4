"""Output-length buckets: what the sweep measures and the routing table routes by.

A bucket is an upper bound on a request's output length plus the workload that stands for it
(random dataset, input 1024, range ratio 0.5, concurrency 64, temperature 0 — the published
benchmark's settings). Each bucket can be measured at several concurrency levels and sampling
temperatures; the first of each is the bucket's primary cell (it picks the bucket's config). Every other
(temperature, level) is a candidate cell of the routing table: speculation pays less in big batches, and
sampled drafts are accepted less often, so another config can win there. With one temperature the cells
are load cells that hold for every sampling band.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import ConfigError
from tuning.workload import Workload

__all__ = ["Bucket", "DEFAULT_BOUNDS", "MIN_MEASURED_WAVES", "bucket_name", "make_buckets"]

DEFAULT_BOUNDS = (1024, 4096, 8192, 16384)

MIN_MEASURED_WAVES = 2
"""Fewer prompts than this many times the concurrency is not a steady-state measurement: on an H200
one wave (64 prompts at concurrency 64) measured 0.77x (le2048: the batch empties over the drawn output
lengths) and 1.19x (le256: no prefills between decode steps) the four-wave figure, with 12-17 % run-to-run
CV against 8-10 % (``docs/analyses/gpu_noise/gpu_noise_h200_2026-11-30.md``)."""


def bucket_name(max_output_len: int) -> str:
    return f"le{max_output_len}"


@dataclass(frozen=True)
class Bucket:
    """One output-length bucket.

    Args:
        name: e.g. ``le1024``.
        max_output_len: requests with ``max_tokens`` up to this (and above the previous bound).
        workload: the primary workload (``output_len`` = the bound; ``max_concurrency`` = primary load).
        concurrency_levels: every concurrency measured, primary first, then strictly increasing.
        temperatures: every sampling temperature measured, primary (= ``workload.temperature``) first;
            empty means the workload's alone.
    """

    name: str
    max_output_len: int
    workload: Workload
    concurrency_levels: tuple[int, ...]
    temperatures: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        levels = tuple(int(c) for c in self.concurrency_levels)
        object.__setattr__(self, "concurrency_levels", levels)
        temps = tuple(float(t) for t in self.temperatures) or (self.workload.temperature,)
        object.__setattr__(self, "temperatures", temps)
        if temps[0] != self.workload.temperature or len(set(temps)) != len(temps) or \
                any(not 0.0 <= t <= 2.0 for t in temps):
            raise ConfigError(f"bucket {self.name}: temperatures must be distinct, in 0..2, the workload's "
                              f"({self.workload.temperature}) first; got {list(temps)}")
        if not levels or any(c < 1 for c in levels):
            raise ConfigError(f"bucket {self.name}: concurrency levels must be >= 1, got {levels}")
        if list(levels) != sorted(set(levels)):
            raise ConfigError(
                f"bucket {self.name}: concurrency levels must be strictly increasing (the first is the primary "
                f"load that picks the bucket's config; higher ones are candidate load cells), got {list(levels)}"
            )
        if self.workload.max_concurrency != levels[0]:
            raise ConfigError(f"bucket {self.name}: workload.max_concurrency must equal the primary level {levels[0]}")

    @property
    def primary_concurrency(self) -> int:
        return self.concurrency_levels[0]

    @property
    def primary_temperature(self) -> float:
        return self.temperatures[0]

    def points(self) -> list[tuple[int, float]]:
        """Every (concurrency, temperature) measured, the primary cell first."""
        return [(c, t) for t in self.temperatures for c in self.concurrency_levels]

    def measurement_key(self, concurrency: int, temperature: float) -> tuple[Any, ...]:
        """The key of one point's measurement: ``(bucket, concurrency)`` at the primary temperature (as
        for a one-temperature bucket), ``(bucket, concurrency, temperature)`` at the others."""
        if temperature == self.primary_temperature:
            return (self.name, concurrency)
        return (self.name, concurrency, temperature)

    def is_primary(self, concurrency: int, temperature: float) -> bool:
        return concurrency == self.primary_concurrency and temperature == self.primary_temperature

    @property
    def waves(self) -> float:
        """Measured prompts per concurrency slot at the primary load: how many times the batch refills."""
        return self.workload.num_prompts / self.primary_concurrency

    def workload_at(self, concurrency: int, temperature: float | None = None) -> Workload:
        """The bucket's workload at another load (prompts scale so the engine stays saturated) and,
        if given, another sampling temperature."""
        base = self.workload
        if temperature is not None and temperature != base.temperature:
            base = dataclasses.replace(base, temperature=float(temperature))
        if concurrency == self.primary_concurrency:
            return base
        scale = concurrency / self.primary_concurrency
        return dataclasses.replace(
            base, max_concurrency=concurrency, num_prompts=max(int(round(base.num_prompts * scale)), concurrency)
        )

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "max_output_len": self.max_output_len,
               "workload": self.workload.to_dict(), "concurrency_levels": list(self.concurrency_levels)}
        if len(self.temperatures) > 1:
            out["temperatures"] = list(self.temperatures)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Bucket:
        return cls(name=d["name"], max_output_len=int(d["max_output_len"]),
                   workload=Workload.from_dict(d["workload"]),
                   concurrency_levels=tuple(d["concurrency_levels"]), temperatures=tuple(d.get("temperatures", ())))


def make_buckets(
    bounds: Sequence[int] = DEFAULT_BOUNDS,
    *,
    input_len: int = 1024,
    range_ratio: float = 0.5,
    concurrency_levels: Sequence[int] = (64,),
    num_prompts: int | Mapping[int, int] = 256,
    temperature: float = 0.0,
    temperatures: Sequence[float] = (),
    seed: int = 0,
    dataset: str = "random",
    sharegpt_path: str | None = None,
    warmup_requests: int = 0,
) -> tuple[Bucket, ...]:
    """Buckets for the given upper bounds, each with the published random-dataset workload.

    ``num_prompts`` may be one number or a mapping bound -> prompts (long buckets need fewer prompts
    to reach steady state; the bench's steady-state rule stops them early anyway). ``temperatures``:
    every sampling temperature to measure, the primary first (default: ``temperature`` alone).
    """
    temps = tuple(float(t) for t in temperatures) or (float(temperature),)
    b = [int(x) for x in bounds]
    if not b or b != sorted(set(b)) or b[0] < 1:
        raise ConfigError(f"bucket bounds must be positive and strictly increasing, got {list(bounds)}")
    levels = tuple(int(c) for c in concurrency_levels)
    out = []
    for bound in b:
        n = num_prompts[bound] if isinstance(num_prompts, Mapping) else num_prompts
        wl = Workload(
            dataset=dataset, input_len=input_len, output_len=bound, range_ratio=range_ratio,
            num_prompts=int(n), max_concurrency=levels[0] if levels else None, temperature=temps[0],
            seed=seed, sharegpt_path=sharegpt_path, name=bucket_name(bound), warmup_requests=int(warmup_requests),
        )
        out.append(Bucket(bucket_name(bound), bound, wl, levels, temps))
    return tuple(out)
