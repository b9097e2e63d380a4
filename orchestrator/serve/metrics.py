"""Metrics of the router and the engine replicas, exported through ``ray.serve.metrics``.

Ray prefixes every application metric with ``ray_`` and adds Serve's own tags (``deployment``,
``replica``, ``application``), so in Prometheus these appear as e.g.
``ray_mtp_router_requests_total{bucket="le1024", engine="sim-mtp3-...", deployment="router"}``.
Our tag for the engine deployment is ``engine`` because Serve reserves ``deployment``.

Router-side figures (TTFT, TPOT, output tokens) are measured on the stream the router forwards, in
wall-clock time — what a client sees, including the router's own overhead. With the simulated engine
they are real seconds, not the simulator's scaled time.

Also here: :func:`parse_prometheus_text`, :func:`drafting_sequences` and :class:`AcceptLengthTracker`,
pure helpers the replica uses to turn an engine's LMDeploy counters into a live accept length and an
estimate of the engine's tokens per step.
"""
from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from orchestrator.backends import MetricNames
from orchestrator.backends.lmdeploy import LMDEPLOY_METRICS
from orchestrator.serve.policy import requested_max_tokens
from orchestrator.spec_counting import ACCEPTED_TOKENS, DRAFT_TOKENS, DRAFTS, accept_length_of, estimate_tokens_per_step

__all__ = [
    "ACCEPTED_TOKENS",
    "DRAFT_TOKENS",
    "DRAFTS",
    "ESTIMATE_WINDOW_S",
    "AcceptLengthTracker",
    "EngineMetrics",
    "RouterMetrics",
    "drafting_sequences",
    "parse_prometheus_text",
]

RUNNING = LMDEPLOY_METRICS.running
WAITING = LMDEPLOY_METRICS.waiting

ESTIMATE_WINDOW_S = 60.0
"""How far back the live tokens-per-step estimate looks (:class:`AcceptLengthTracker`)."""

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
    sequences: int


def drafting_sequences(body: bytes) -> int:
    """How many sequences one answered request adds to the count :class:`AcceptLengthTracker` divides
    by: each of its ``n`` sequences (default 1) ends with a counted last step, but only when it could
    draft — an output cap (``max_tokens``, ``max_completion_tokens`` winning as in
    :func:`~orchestrator.serve.policy.requested_max_tokens`) of 1 or less runs no decode step (the
    prefill makes the only token), so a health ping must not count. A body that is not a JSON object
    counts as one sequence (the router forwards only validated bodies; the default is the common
    request)."""
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):
        return 1
    if not isinstance(request, dict):
        return 1
    cap = requested_max_tokens(request.get("max_tokens"), request.get("max_completion_tokens"))
    if isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap <= 1:
        return 0
    n = request.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1


@dataclass
class AcceptLengthTracker:
    """Live accept length from successive scrapes of LMDeploy's spec-decode counters, and the engine's
    tokens per step behind it.

    :attr:`accept_length` — the accept length as LMDeploy counts it, ``1 + Δaccepted / Δdrafts`` over
    the interval since the previous scrape, where Δdrafts = Δdraft_tokens / N (N = draft tokens per
    draft step, from the engine config): the bench client's definition, and what the
    ``mtp_engine_accept_length`` gauge shows.

    :attr:`tokens_per_step_estimate` — the engine's tokens per step. Under load LMDeploy counts a few
    outputs per sequence, always its length-biased last step, so the counted figure reads high (why:
    :mod:`orchestrator.spec_counting`). :func:`~orchestrator.spec_counting.estimate_tokens_per_step`
    undoes that with the counted figure, the counted drafts and the sequences the replica saw end,
    all three over the same ``window`` of scrape intervals: the correction holds for whole
    sequences, and a counted figure from one span corrected with outputs per sequence from another
    errs whenever the load changes — a new phase's first interval (an even sample, no sequence
    ended) would be corrected as if coalesced like the phase before, a burst's tail (its last steps,
    few others) as if not. The window makes the estimate slow (a minute); how long the alert must
    hold before it fires is the Prometheus rule's ``for:``.

    A window in which no sequence ended holds no sequence's last step, only outputs picked by time
    (an even sample of the steps), so its counted figure *is* the estimate. A scrape in which
    nothing happened (no counted draft, no sequence ended: idle, or MTP off) changes no figure, so
    an idle engine keeps its last reading rather than raising or clearing the alert as the window
    empties.

    Counters that went backwards (engine restarted) start a new baseline instead of giving a negative
    figure; figures outside the model's domain are clamped, never raised
    (:func:`~orchestrator.spec_counting.estimate_tokens_per_step`).
    """

    num_draft_tokens: int
    window: int
    """Scrape intervals the estimate spans; :meth:`for_poll` makes it a span of seconds."""
    names: MetricNames = LMDEPLOY_METRICS
    """The engine's counter names (its backend's :class:`~orchestrator.backends.MetricNames`)."""
    accept_length: float | None = field(default=None, init=False)
    tokens_per_step_estimate: float | None = field(default=None, init=False)
    outputs_per_request: float | None = field(default=None, init=False)
    """Counted drafts per ended sequence over the estimate's window; ``None`` when none ended in it (no
    last step counted: no correction)."""
    _scrapes: deque[_Scrape] = field(default_factory=deque, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window={self.window}; allowed: >= 1 scrape interval")

    @classmethod
    def for_poll(cls, num_draft_tokens: int, poll_s: float, names: MetricNames = LMDEPLOY_METRICS, *,
                 window_s: float = ESTIMATE_WINDOW_S) -> AcceptLengthTracker:
        """A tracker whose estimate spans ``window_s`` of scrapes ``poll_s`` apart."""
        return cls(num_draft_tokens, window=max(1, round(window_s / poll_s)), names=names)

    def update(self, samples: Mapping[str, float], sequences: int) -> float | None:
        """Take one scrape (``samples``, :func:`parse_prometheus_text`) and the replica's running total
        of ended sequences that could draft (:func:`drafting_sequences`); returns the counted accept
        length (also :attr:`accept_length`)."""
        n = self.names
        if self.num_draft_tokens <= 0 or n.accepted_tokens not in samples or n.draft_tokens not in samples:
            return self.accept_length
        now = _Scrape(samples[n.accepted_tokens], samples[n.draft_tokens], samples.get(n.drafts), int(sequences))
        if self._scrapes and not _ahead(now, self._scrapes[-1]):
            self._scrapes.clear()  # counters reset: a new baseline
        self._scrapes.append(now)
        while len(self._scrapes) > self.window + 1:
            self._scrapes.popleft()
        if len(self._scrapes) < 2:
            return self.accept_length
        before, first = self._scrapes[-2], self._scrapes[0]
        interval = self._counted(before, now)
        if interval is not None:
            self.accept_length = interval
        elif now.sequences == before.sequences:
            return self.accept_length  # nothing happened: keep the window's last figures
        whole = self._counted(first, now)
        if whole is None:
            return self.accept_length
        drafts = (now.draft_tokens - first.draft_tokens) / self.num_draft_tokens
        if now.drafts is not None and first.drafts is not None and now.drafts > first.drafts:
            drafts = now.drafts - first.drafts
        ended = now.sequences - first.sequences
        self.outputs_per_request = drafts / ended if ended > 0 else None
        self.tokens_per_step_estimate = estimate_tokens_per_step(whole, self.num_draft_tokens, drafts, ended)
        return self.accept_length

    def low(self, threshold: float) -> bool | None:
        """Whether the engine's tokens per step (the estimate) is below ``threshold``; ``None`` before
        there is one."""
        return None if self.tokens_per_step_estimate is None else self.tokens_per_step_estimate < threshold

    def _counted(self, before: _Scrape, after: _Scrape) -> float | None:
        return accept_length_of(after.accepted - before.accepted, after.draft_tokens - before.draft_tokens,
                                self.num_draft_tokens)


def _ahead(now: _Scrape, last: _Scrape) -> bool:
    return now.accepted >= last.accepted and now.draft_tokens >= last.draft_tokens and now.sequences >= last.sequences


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
            "under load it reads above the engine's tokens per step (see mtp_engine_tokens_per_step_estimate).",
            tag_keys=("engine",),
        )
        self.tokens_per_step_estimate = Gauge(
            "mtp_engine_tokens_per_step_estimate",
            "Estimated tokens per decode step of the engine over the last minute: the counted accept length "
            "corrected for LMDeploy counting a few steps per sequence, always its last "
            "(orchestrator/spec_counting.py).",
            tag_keys=("engine",),
        )
        self.accept_length_low = Gauge(
            "mtp_engine_accept_length_low",
            "1 when the engine's estimated tokens per step (mtp_engine_tokens_per_step_estimate) is below the "
            "warning threshold, else 0.",
            tag_keys=("engine",),
        )
        self.running = Gauge("mtp_engine_requests_running", "The engine's own running-requests gauge (lmdeploy:, vllm:num_requests_running).", tag_keys=("engine",))
        self.waiting = Gauge("mtp_engine_requests_waiting", "The engine's own waiting-requests gauge (lmdeploy:, vllm:num_requests_waiting).", tag_keys=("engine",))
        self.scrape_errors = Gauge(
            "mtp_engine_metrics_scrape_ok", "1 when the last scrape of the engine's /metrics succeeded.",
            tag_keys=("engine",),
        )
