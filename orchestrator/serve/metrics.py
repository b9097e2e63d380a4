"""Metrics of the router and the engine replicas, exported through ``ray.serve.metrics``.

Ray prefixes every application metric with ``ray_`` and adds Serve's own tags (``deployment``,
``replica``, ``application``), so in Prometheus these appear as e.g.
``ray_mtp_router_requests_total{bucket="le1024", engine="sim-mtp3-...", deployment="router"}``.
Our tag for the engine deployment is ``engine`` because Serve reserves ``deployment``.

Router-side figures (TTFT, TPOT, output tokens) are measured on the stream the router forwards, in
wall-clock time — what a client sees, including the router's own overhead. With the simulated engine
they are real seconds, not the simulator's scaled time.

Also here: :func:`parse_prometheus_text` and :class:`AcceptLengthTracker`, pure helpers the replica
uses to turn an engine's LMDeploy counters into a live accept length and the engine's tokens per step.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from orchestrator.spec_counting import ACCEPTED_TOKENS, DRAFT_TOKENS, DRAFTS, estimate_tokens_per_step

__all__ = [
    "ACCEPTED_TOKENS",
    "DRAFT_TOKENS",
    "DRAFTS",
    "ESTIMATE_WINDOW_S",
    "AcceptLengthTracker",
    "EngineMetrics",
    "RouterMetrics",
    "parse_prometheus_text",
]

RUNNING = "lmdeploy:num_requests_running"
WAITING = "lmdeploy:num_requests_waiting"

ESTIMATE_WINDOW_S = 60.0
"""How far back the live tokens-per-step estimate counts outputs per request (:class:`AcceptLengthTracker`)."""

_LATENCY_BOUNDARIES_S = [
    0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0,
]
_TPOT_BOUNDARIES_S = [0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0]


def parse_prometheus_text(text: str) -> dict[str, float]:
    """Sum of each sample name over its labels (engines here expose one series per name).

    Tolerant: lines that do not parse are skipped (a scrape must never break a replica)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        try:
            if "{" in line:
                name = line[: line.index("{")].strip()
                v = float(line[line.rindex("}") + 1 :].split()[0])
            else:
                parts = line.split()
                name, v = parts[0], float(parts[1])
        except (ValueError, IndexError):
            continue
        if math.isfinite(v):
            out[name] = out.get(name, 0.0) + v
    return out


@dataclass(frozen=True)
class _Scrape:
    accepted: float
    draft_tokens: float
    drafts: float | None
    finished: int


@dataclass
class AcceptLengthTracker:
    """Live accept length from successive scrapes of LMDeploy's spec-decode counters, and the engine's
    tokens per step behind it.

    :attr:`value` — the accept length as LMDeploy counts it: ``1 + Δaccepted / Δdrafts`` over the
    interval since the previous scrape, where Δdrafts = Δdraft_tokens / N (N = draft tokens per draft
    step, from the engine config) — the same definition as the bench client's.

    :attr:`tokens_per_step` — the estimate of the engine's true tokens per step behind :attr:`value`.
    Under load LMDeploy counts only a few decode outputs per request, always its last (length-biased,
    untruncated) step, so :attr:`value` reads high (:mod:`orchestrator.spec_counting`).
    :func:`~orchestrator.spec_counting.estimate_tokens_per_step` inverts that counting with
    :attr:`outputs_per_request`: the counted drafts (``Δnum_drafts``, else Δdraft_tokens / N) over the
    requests the replica finished (``finished``, a running total: streams cut off mid-way delivered
    outputs too), taken over the last ``window`` scrape intervals. The ratio needs whole requests: one
    interval that holds only the tail of a burst counts a request's last few steps against its
    completion and would read as heavily coalesced, so an alert on the estimate would flap with it. The
    accept length itself stays the last interval's, so the estimate answers as fast as :attr:`value`.

    A window in which no request finished has no request's last step in its counters, only outputs
    picked by time — an even sample of the steps — so the counted figure *is* the estimate (the
    correction vanishes as outputs per request grow): no fallback is needed. An interval without
    counted drafts (idle, or MTP off) changes neither figure, so an idle engine keeps its last reading
    rather than raising or clearing the alert.

    Counters that went backwards (engine restarted) start a new baseline instead of giving a negative
    figure; figures that stray outside the model's domain (an accepted count read ahead of its drafts,
    a request finishing between two scrapes of its last step) are clamped, never raised.
    """

    num_draft_tokens: int
    window: int = 1
    """Scrape intervals :attr:`outputs_per_request` spans; the replica's span :data:`ESTIMATE_WINDOW_S`
    (:meth:`for_poll`)."""
    value: float | None = None
    tokens_per_step: float | None = None
    outputs_per_request: float | None = None
    """Counted drafts per finished request over the window; ``None`` when no request finished in it (as
    many outputs per request as steps: no correction)."""
    _scrapes: deque[_Scrape] = field(default_factory=deque, repr=False)

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window={self.window}; allowed: >= 1 scrape interval")

    @classmethod
    def for_poll(cls, num_draft_tokens: int, poll_s: float) -> AcceptLengthTracker:
        """A tracker whose outputs per request span :data:`ESTIMATE_WINDOW_S` of scrapes ``poll_s`` apart."""
        return cls(num_draft_tokens, window=max(1, round(ESTIMATE_WINDOW_S / poll_s)))

    def update(self, samples: Mapping[str, float], finished: int) -> float | None:
        """Take one scrape (``samples``, :func:`parse_prometheus_text`) and the replica's running total
        of finished requests; returns the counted accept length (also :attr:`value`)."""
        if self.num_draft_tokens <= 0 or ACCEPTED_TOKENS not in samples or DRAFT_TOKENS not in samples:
            return self.value
        now = _Scrape(samples[ACCEPTED_TOKENS], samples[DRAFT_TOKENS], samples.get(DRAFTS), int(finished))
        if self._scrapes and not _ahead(now, self._scrapes[-1]):
            self._scrapes.clear()  # counters reset: a new baseline
        self._scrapes.append(now)
        while len(self._scrapes) > self.window + 1:
            self._scrapes.popleft()
        if len(self._scrapes) < 2:
            return self.value
        before = self._scrapes[-2]
        interval_drafts = (now.draft_tokens - before.draft_tokens) / self.num_draft_tokens
        if interval_drafts <= 0:
            return self.value
        self.value = 1.0 + (now.accepted - before.accepted) / interval_drafts
        first = self._scrapes[0]
        window_drafts = (now.draft_tokens - first.draft_tokens) / self.num_draft_tokens
        if now.drafts is not None and first.drafts is not None and now.drafts > first.drafts:
            window_drafts = now.drafts - first.drafts
        done = now.finished - first.finished
        self.outputs_per_request = window_drafts / done if done > 0 else None
        self.tokens_per_step = estimate_tokens_per_step(self.value, self.num_draft_tokens, self.outputs_per_request)
        return self.value

    def low(self, threshold: float) -> bool | None:
        """Whether the engine's tokens per step (the estimate) is below ``threshold``; ``None`` before
        there is one."""
        return None if self.tokens_per_step is None else self.tokens_per_step < threshold


def _ahead(now: _Scrape, last: _Scrape) -> bool:
    return now.accepted >= last.accepted and now.draft_tokens >= last.draft_tokens and now.finished >= last.finished


class RouterMetrics:
    """The router's metrics. Created inside the router replica (Serve tags need its context)."""

    def __init__(self) -> None:
        from ray.serve.metrics import Counter, Gauge, Histogram

        tags = ("bucket", "engine", "cell")
        self.requests = Counter(
            "mtp_router_requests", "Requests the router forwarded, by bucket and engine deployment.",
            tag_keys=tags + ("status",),
        )
        self.output_tokens = Counter(
            "mtp_router_output_tokens", "Output tokens streamed back through the router.", tag_keys=tags,
        )
        self.ttft = Histogram(
            "mtp_router_ttft_seconds", "Time to first streamed chunk, measured at the router.",
            boundaries=_LATENCY_BOUNDARIES_S, tag_keys=tags,
        )
        self.tpot = Histogram(
            "mtp_router_tpot_seconds", "Time per output token after the first, measured at the router.",
            boundaries=_TPOT_BOUNDARIES_S, tag_keys=tags,
        )
        self.errors = Counter(
            "mtp_router_errors", "Requests answered with an error, by kind.", tag_keys=("kind",),
        )
        self.fallbacks = Counter(
            "mtp_router_fallbacks", "Requests sent to another bucket's engine because theirs was unhealthy.",
            tag_keys=("from_bucket", "to_bucket"),
        )
        self.in_flight = Gauge(
            "mtp_router_in_flight", "Requests this router replica has in flight per engine deployment.",
            tag_keys=("engine",),
        )


class EngineMetrics:
    """An engine replica's re-exported engine figures. Created inside the replica."""

    def __init__(self, engine: str) -> None:
        from ray.serve.metrics import Gauge

        self.tags = {"engine": engine}
        self.accept_length = Gauge(
            "mtp_engine_accept_length",
            "Live MTP accept length as LMDeploy counts it (1 + accepted / drafts over the last poll interval); "
            "reads above the engine's tokens per step under load.",
            tag_keys=("engine",),
        )
        self.tokens_per_step = Gauge(
            "mtp_engine_tokens_per_step",
            "Estimated: the counted accept length corrected for LMDeploy counting a few steps per request, "
            "always its last (the engine's tokens per decode step, last poll interval; outputs per request of the "
            "last minute).",
            tag_keys=("engine",),
        )
        self.accept_length_low = Gauge(
            "mtp_engine_accept_length_low",
            "1 when the engine's estimated tokens per step (mtp_engine_tokens_per_step) is below the warning "
            "threshold, else 0.",
            tag_keys=("engine",),
        )
        self.running = Gauge("mtp_engine_requests_running", "lmdeploy:num_requests_running.", tag_keys=("engine",))
        self.waiting = Gauge("mtp_engine_requests_waiting", "lmdeploy:num_requests_waiting.", tag_keys=("engine",))
        self.scrape_errors = Gauge(
            "mtp_engine_metrics_scrape_ok", "1 when the last scrape of the engine's /metrics succeeded.",
            tag_keys=("engine",),
        )
