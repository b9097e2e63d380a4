"""Typed records of a benchmark: one request's outcome, latency statistics, the whole result, and
what was learned about the server (vLLM's ``RequestFuncOutput`` / result split). Pure data."""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuning.bench.errors import BenchError

__all__ = ["BenchResult", "LatencyStats", "RequestOutput", "ServerInfo", "SimClock", "compute_latency_stats"]


@dataclass(frozen=True)
class LatencyStats:
    """Mean, median and 99th percentile of one latency, in milliseconds."""

    mean: float = 0.0
    median: float = 0.0
    p99: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LatencyStats:
        return cls(**{k: float(data[k]) for k in ("mean", "median", "p99")})


def compute_latency_stats(seconds: Sequence[float], scale: float = 1.0) -> LatencyStats:
    """Stats in ms of durations given in seconds times ``scale``; zeros for no samples (as sglang)."""
    if len(seconds) == 0:
        return LatencyStats()
    a = np.asarray(seconds, dtype=float) * scale * 1000.0
    return LatencyStats(mean=float(np.mean(a)), median=float(np.median(a)), p99=float(np.percentile(a, 99)))


@dataclass(frozen=True)
class RequestOutput:
    """What happened to one request. Times are client wall-clock seconds (not time-scaled).

    Attributes:
        index: position in the workload's request list.
        success: the stream finished with ``[DONE]``.
        error_kind: ``None`` on success, else e.g. ``"HTTP 500"``, ``"timeout"``, ``"connection"``,
            ``"incomplete stream"``, ``"stream error"``, ``"cancelled"`` (stopped early by the bench).
        error: the error's message (response body, exception text).
        ttft: seconds to the first chunk with text (``None`` if none came).
        itl: gaps between chunks with text, seconds.
        latency: seconds from send to the last chunk (to the failure for failed requests).
        prompt_len / output_len: tokens in / out (out: usage, else counted; partial for failures).
        started_at / finished_at: ``time.monotonic()`` stamps.
        last_token_at: stamp of the last chunk with text (``None`` if none).
    """

    index: int
    success: bool
    error_kind: str | None
    error: str
    ttft: float | None
    itl: tuple[float, ...]
    latency: float
    prompt_len: int
    output_len: int
    started_at: float
    finished_at: float
    last_token_at: float | None = None

    @property
    def cancelled(self) -> bool:
        return self.error_kind == "cancelled"


@dataclass(frozen=True)
class BenchResult:
    """What one benchmark measured (JSON via :meth:`to_json`). Latencies in ms, throughputs per s;
    all in simulated time when ``simulated``."""

    workload: dict
    engine_key: str | None
    engine_config: dict | None
    versions: dict
    started_at: str
    finished_at: str
    duration_s: float
    completed: int
    failed: int
    failure_reasons: dict[str, int]
    request_throughput: float
    input_throughput: float
    output_throughput: float
    total_token_throughput: float
    total_input_tokens: int
    total_output_tokens: int
    ttft_ms: LatencyStats
    tpot_ms: LatencyStats
    itl_ms: LatencyStats
    e2e_ms: LatencyStats
    accept_length: float | None
    spec_counters: dict
    simulated: bool
    time_scale: float
    early_stopped: bool
    concurrency: int | None
    cancelled: int = 0
    """Requests cancelled by the steady-state early stop (neither completed nor failed)."""
    steady_state: dict | None = None
    """:class:`SteadyStateEstimate` as a dict when a rule was given and windows were observed."""
    tokens_per_step_estimate: float | None = None
    """The engine's tokens per step behind ``accept_length``, which reads high under load (a few steps
    per request counted, always its last: :mod:`orchestrator.spec_counting`); estimated by
    :func:`tuning.bench.counters.tokens_per_step_from_counters`, ``None`` without a counted figure.
    ``accept_length`` stays as counted."""

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchResult:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise BenchError(f"unknown BenchResult field(s) {unknown}; known: {sorted(known)}")
        kwargs = dict(data)
        for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            kwargs[k] = LatencyStats.from_dict(kwargs[k])
        return cls(**kwargs)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> BenchResult:
        return cls.from_dict(json.loads(text))


@dataclass(frozen=True)
class ServerInfo:
    """What the bench learned about the server before measuring."""

    model: str
    simulated: bool
    time_scale: float
    engine: str
    sim_info: dict | None = None
    sim_clock: SimClock | None = None


@dataclass(frozen=True)
class SimClock:
    """Maps the simulator's token stamps (simulated seconds since it started) onto this host's
    monotonic clock.

    The simulator delivers tokens in batches (up to a few ms late) so it can run many times faster
    than real time; each chunk carries the simulated time at which its tokens were produced. When
    the simulator runs on this host (same boot id: CLOCK_MONOTONIC is shared), the bench times
    token events by those stamps instead of by their arrival, so figures stay exact at any time
    scale. On another host it falls back to arrival times.
    """

    monotonic_start: float
    time_scale: float
    delivery_quantum_s: float = 0.005
    """Wall seconds a stamped token may arrive after its time (the simulator's ``/sim/info``)."""

    def local(self, sim_t: float) -> float:
        return self.monotonic_start + float(sim_t) / self.time_scale
