"""Goodput per load phase from a drive's records. Pure.

Definitions (stated in every report):

- A request is **good** when it completed (``ok``) and met the SLO: time to first token at most
  ``ttft_s`` and time per output token after the first at most ``tpot_s``.
- A phase's **throughput** is the output tokens that completed requests produced inside the phase's
  window, over the window's length; its **goodput** counts good requests only. A request's tokens are
  its first token at ``first_token_at`` and the rest spread evenly up to ``finished_at``, so a long
  request that spans phases counts in each for what it produced there. Tokens produced after the
  profile's end (the drain) count in no phase.
- **Overall** is the same over the whole profile.

Why tokens in the window and not requests that started in it: a 8k-token request outlives a 30-second
burst; counting it whole in the phase it started would credit the burst with work done later.
"""
from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from tuning.drive.records import DriveRecord
from tuning.traffic import LoadProfile

__all__ = ["MLPERF_SERVER_SLO", "PhaseFigures", "Slo", "overall_figures", "phase_figures", "tokens_in_window"]


@dataclass(frozen=True)
class Slo:
    """The bounds a completed request must meet to count as good, in (profile) seconds."""

    ttft_s: float
    tpot_s: float

    def __post_init__(self) -> None:
        if self.ttft_s <= 0 or self.tpot_s <= 0:
            raise ValueError(f"SLO bounds must be > 0, got ttft_s={self.ttft_s}, tpot_s={self.tpot_s}")

    def met(self, r: DriveRecord) -> bool:
        if not r.ok or r.ttft is None or r.ttft > self.ttft_s:
            return False
        tpot = r.tpot
        return tpot is None or tpot <= self.tpot_s

    def describe(self) -> str:
        return f"TTFT <= {self.ttft_s:g} s and TPOT <= {self.tpot_s * 1000:g} ms"


MLPERF_SERVER_SLO = Slo(ttft_s=2.0, tpot_s=0.2)
"""The latency bounds of MLPerf Inference's Llama-2-70B server scenario (TTFT 2 s, TPOT 200 ms), applied
per request: a published, model-independent bar for a serving deployment, not one fitted to this project."""


def tokens_in_window(r: DriveRecord, start: float, end: float) -> float:
    """Output tokens ``r`` produced in ``[start, end)``: the first at ``first_token_at``, the others
    evenly over ``(first_token_at, finished_at]``."""
    if r.first_token_at is None or r.output_tokens <= 0 or end <= start:
        return 0.0
    t0 = r.first_token_at
    n = float(r.first_token_at >= start and r.first_token_at < end)
    rest = r.output_tokens - 1
    if rest <= 0:
        return n
    span = r.finished_at - t0
    if span <= 0:  # every token at once
        return n + (rest if start <= t0 < end else 0.0)
    overlap = max(0.0, min(end, r.finished_at) - max(start, t0))
    return n + rest * overlap / span


@dataclass(frozen=True)
class PhaseFigures:
    """One phase (or the whole profile): ``goodput`` and ``throughput`` in output tokens/s; counts of
    requests that started in it, and of those that completed, met the SLO, failed (by kind)."""

    label: str
    start: float
    end: float
    throughput: float
    goodput: float
    started: int
    completed: int
    good: int
    failed: int
    errors: dict[str, int] = field(default_factory=dict)
    ttft_median_s: float | None = None
    tpot_median_s: float | None = None

    @property
    def good_share(self) -> float | None:
        return self.good / self.completed if self.completed else None


def _figures(records: Sequence[DriveRecord], slo: Slo, label: str, start: float, end: float,
             started: Sequence[DriveRecord]) -> PhaseFigures:
    length = end - start
    ok = [r for r in records if r.ok]
    tput = sum(tokens_in_window(r, start, end) for r in ok) / length
    good = sum(tokens_in_window(r, start, end) for r in ok if slo.met(r)) / length
    done = [r for r in started if r.ok]
    failed = [r for r in started if not r.ok and r.error_kind != "cancelled"]
    ttfts = [r.ttft for r in done if r.ttft is not None]
    tpots = [t for r in done if (t := r.tpot) is not None]
    return PhaseFigures(
        label=label, start=start, end=end, throughput=tput, goodput=good, started=len(started),
        completed=len(done), good=sum(1 for r in done if slo.met(r)), failed=len(failed),
        errors=dict(Counter(str(r.error_kind) for r in failed)),
        ttft_median_s=statistics.median(ttfts) if ttfts else None,
        tpot_median_s=statistics.median(tpots) if tpots else None)


def phase_figures(records: Sequence[DriveRecord], profile: LoadProfile, slo: Slo) -> list[PhaseFigures]:
    """Figures of each phase of ``profile``, in order."""
    return [_figures(records, slo, profile.label(i), start, end, [r for r in records if r.phase == i])
            for i, (start, end) in enumerate(profile.windows())]


def overall_figures(records: Sequence[DriveRecord], profile: LoadProfile, slo: Slo) -> PhaseFigures:
    """Figures over the whole profile (tokens of the drain excluded; every request counted)."""
    return _figures(records, slo, "overall", 0.0, profile.seconds, records)
