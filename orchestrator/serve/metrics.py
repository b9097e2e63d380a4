"""Metrics of the router and the engine replicas, exported through ``ray.serve.metrics``.

Ray prefixes every application metric with ``ray_`` and adds Serve's own tags (``deployment``,
``replica``, ``application``), so in Prometheus these appear as e.g.
``ray_mtp_router_requests_total{bucket="le1024", engine="sim-mtp3-...", deployment="router"}``.
Our tag for the engine deployment is ``engine`` because Serve reserves ``deployment``.

Router-side figures (TTFT, TPOT, output tokens) are measured on the stream the router forwards, in
wall-clock time — what a client sees, including the router's own overhead. With the simulated engine
they are real seconds, not the simulator's scaled time.

Also here: :func:`parse_prometheus_text` and :class:`AcceptLengthTracker`, pure helpers the replica
uses to turn an engine's LMDeploy counters into a live accept length.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "ACCEPTED_TOKENS",
    "DRAFT_TOKENS",
    "DRAFTS",
    "AcceptLengthTracker",
    "EngineMetrics",
    "RouterMetrics",
    "parse_prometheus_text",
]

ACCEPTED_TOKENS = "lmdeploy:spec_decode_num_accepted_tokens_total"
DRAFT_TOKENS = "lmdeploy:spec_decode_num_draft_tokens_total"
DRAFTS = "lmdeploy:spec_decode_num_drafts_total"
RUNNING = "lmdeploy:num_requests_running"
WAITING = "lmdeploy:num_requests_waiting"

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


@dataclass
class AcceptLengthTracker:
    """Live accept length from successive scrapes of LMDeploy's spec-decode counters.

    accept length = 1 + Δaccepted / Δdrafts, where Δdrafts = Δdraft_tokens / N (N = draft tokens per
    draft step, from the engine config) — the same definition as the bench client's. Counters that
    went backwards (engine restarted) reset the baseline instead of giving a negative figure.
    """

    num_draft_tokens: int
    _last: tuple[float, float] | None = None
    value: float | None = None

    def update(self, samples: Mapping[str, float]) -> float | None:
        if self.num_draft_tokens <= 0 or ACCEPTED_TOKENS not in samples or DRAFT_TOKENS not in samples:
            return self.value
        now = (samples[ACCEPTED_TOKENS], samples[DRAFT_TOKENS])
        last, self._last = self._last, now
        if last is None:
            return self.value
        d_acc, d_draft_tokens = now[0] - last[0], now[1] - last[1]
        if d_acc < 0 or d_draft_tokens < 0:
            return self.value  # counters reset
        drafts = d_draft_tokens / self.num_draft_tokens
        if drafts > 0:
            self.value = 1.0 + d_acc / drafts
        return self.value


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
            "Live MTP accept length of the engine (1 + accepted / drafts over the last poll interval).",
            tag_keys=("engine",),
        )
        self.accept_length_low = Gauge(
            "mtp_engine_accept_length_low",
            "1 when the engine's live accept length is below the warning threshold, else 0.",
            tag_keys=("engine",),
        )
        self.running = Gauge("mtp_engine_requests_running", "lmdeploy:num_requests_running.", tag_keys=("engine",))
        self.waiting = Gauge("mtp_engine_requests_waiting", "lmdeploy:num_requests_waiting.", tag_keys=("engine",))
        self.scrape_errors = Gauge(
            "mtp_engine_metrics_scrape_ok", "1 when the last scrape of the engine's /metrics succeeded.",
            tag_keys=("engine",),
        )
