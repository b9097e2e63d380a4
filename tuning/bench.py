"""The benchmark client: drive an OpenAI-compatible server with a :class:`Workload`, return a
:class:`BenchResult`. ``python -m tuning.bench --help`` is the CLI.

Figures are defined exactly as ``sglang.bench_serving`` defines them, so they compare with
published tables:

- **TTFT**: request sent -> first streamed chunk with text.
- **ITL**: the gaps between consecutive streamed chunks with text (one entry per chunk, so a chunk
  carrying several speculative tokens is one gap).
- **TPOT** per request: ``(e2e - ttft) / (output_tokens - 1)`` for requests with > 1 output token.
- **E2E**: request sent -> last chunk.
- Throughputs: completed requests' totals / benchmark duration (first measured request sent ->
  last one finished; warm-up excluded). Output tokens are the server's ``usage.completion_tokens``
  (final stream chunk, ``stream_options.include_usage``) or, when absent, the generated text's
  token count. Percentiles with ``numpy.percentile``; a figure with no samples is 0 (as sglang).
- **Accept length**: ``1 + Δaccepted / (Δdraft_tokens / N)`` from the engine's
  ``lmdeploy:spec_decode_*`` counters scraped before and after the measured requests, ``N`` the
  draft tokens per draft step (from the engine config, else ``Δdraft_tokens / Δdrafts``).

Against the simulated engine (``GET /sim/info`` answers, or responses carry
``x-simulated-engine: true``) every measured wall duration is multiplied by the simulator's
``time_scale``, so all figures are in simulated time, and ``simulated`` is true.

A failed request is data (``RequestOutput.error_kind``), never an exception: failures are counted
in ``failed`` and ``failure_reasons``, and the run goes on.

**Steady-state early stop** (:class:`SteadyStateRule`): with long outputs most of a run's wall time
is spent waiting for the slowest requests, while the figure a sweep ranks by — output throughput at
the bucket's concurrency — is known long before. While the system is saturated (every concurrency
slot busy, one full turnover done — the first ``concurrency`` requests finished — and requests still
waiting for a slot) the client counts
output tokens per fixed window and computes a batch-means confidence interval of the throughput.
Once its half-width is within ``rel_tolerance`` of the mean (and ``min_windows`` windows are in, and
the two halves of the windows agree, so the rate is not still drifting) *and* the rest of the run is
predictable, outstanding requests are cancelled (counted as ``cancelled``, not failed) and
``output_throughput`` is the predicted **output throughput of the whole run**.

Predicting the rest: until the last request starts, the closed loop goes on at the steady-state
rate; then comes the final drain, where occupancy falls from ``concurrency`` to 0 and every
sequence speeds up because each decode step has fewer sequences to serve. The drain is predicted
step by step with a :class:`StepTimeModel` measured from the stream alone: step time against
running sequences from an *occupancy probe* sent before the measured run (``concurrency`` short
requests of staggered lengths, so occupancy falls one sequence at a time; a MoE engine's curve is
strongly concave, so it is used as measured), step time against context from the run's own windows
(mean gap between a request's chunks ~ one step; prefills enter as a count), and tokens per step
by output position (speculative decoding accepts more late in an output). With ``ignore_eos`` the
remaining work is known exactly. The prediction is made at ``z`` standard errors of the model's step
times either way (``z`` from ``confidence``); the run stops only when those two full-run figures are
within ``drain_tolerance`` (±1%) of their midpoint (:func:`full_run_throughput_bounds`), which is
reported. Without a probe (it failed, or saw too few occupancy levels) the bounds are model-free
(drain between the steady per-sequence rate and the whole steady throughput) and too wide to stop
unless the drain is a tiny share of the run. The early-stopped figure is thus the full run's within
the statistical tolerance plus the drain tolerance, plus the step-time model's form error (measured
in ``benchmarks/results/early_stop_agreement.md``). The rule needs at least one full turnover and
``min_windows`` windows of steady state, so it saves time only on runs of several turnovers; shorter
runs go to completion. Other figures then come from what was observed until the stop: latency
statistics of completed requests, plus TTFT/ITL/TPOT of the cancelled requests' received part (so
long requests are not left out of the per-token figures); request/input throughput are completed
requests over the shortened duration. ``steady_state`` in the result records the estimate either way.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import math
import platform
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import numpy as np

from orchestrator.errors import OrchestratorError
from orchestrator.fsutil import utc_now_iso
from orchestrator.ports import host_boot_id
from tuning.progress import BenchProgress, RichProgress, SafeProgress
from tuning.workload import RequestSpec, TokenCounter, Workload, build_requests, resolve_token_counter

if TYPE_CHECKING:
    from orchestrator.config import EngineConfig

__all__ = [
    "BenchError",
    "BenchProgress",
    "BenchResult",
    "LatencyStats",
    "RequestOutput",
    "ServerInfo",
    "ServerUnreachableError",
    "SteadyStateEstimate",
    "SteadyStateRule",
    "StepTimeModel",
    "accept_length_from_counters",
    "benchmark",
    "compute_latency_stats",
    "fit_occupancy_curve",
    "fit_step_model",
    "full_run_throughput_bounds",
    "occupancy_probe_lengths",
    "predict_drain_end",
    "predict_full_run_end",
    "main",
    "parse_spec_counters",
    "run_benchmark",
]

logger = logging.getLogger(__name__)

SPEC_COUNTER_NAMES: dict[str, str] = {
    "num_drafts": "lmdeploy:spec_decode_num_drafts_total",
    "num_draft_tokens": "lmdeploy:spec_decode_num_draft_tokens_total",
    "num_accepted_tokens": "lmdeploy:spec_decode_num_accepted_tokens_total",
}
"""Our name -> LMDeploy's Prometheus sample name of each speculative-decoding counter."""

SIM_HEADER = "x-simulated-engine"
PROBE_TIMEOUT_S = 10.0
WARMUP_MAX_OUTPUT_TOKENS = 32
"""Warm-up requests ask for at most this many tokens: they warm the server, they measure nothing."""


class BenchError(OrchestratorError):
    """The benchmark could not run at all (as opposed to single requests failing, which is data)."""


class ServerUnreachableError(BenchError):
    """``GET /v1/models`` did not answer: no server at that URL, or not OpenAI-compatible."""


# ----- records ------------------------------------------------------------------------------------


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
class SteadyStateRule:
    """When to stop a run early: steady-state output throughput known within ``rel_tolerance``.

    Args:
        rel_tolerance: stop once the confidence interval's half-width / mean <= this.
        window_s: length of one measurement window, in the server's time (simulated seconds for
            the simulator). Windows should span many decode steps so batch means are ~independent.
        min_windows: never stop on fewer windows; also the least number of batches the interval
            is computed over (see :meth:`_SteadyStateTracker.estimate`).
        confidence: of the two-sided Student-t interval over the window means.
        drain_tolerance: stop only once the full run's predicted throughput (drain included, at
            ``confidence`` bounds of the measured step-time model) is known within this share
            either way (see :func:`full_run_throughput_bounds`).
    """

    rel_tolerance: float = 0.02
    window_s: float = 5.0
    min_windows: int = 8
    confidence: float = 0.95
    drain_tolerance: float = 0.01

    def __post_init__(self) -> None:
        if not (isinstance(self.rel_tolerance, (int, float)) and 0 < self.rel_tolerance < 1):
            raise BenchError(f"rel_tolerance={self.rel_tolerance!r} is out of range; allowed: (0, 1)")
        if not (isinstance(self.window_s, (int, float)) and self.window_s > 0):
            raise BenchError(f"window_s={self.window_s!r} must be a positive number of seconds")
        if not (isinstance(self.min_windows, int) and self.min_windows >= 3):
            raise BenchError(f"min_windows={self.min_windows!r} must be an integer >= 3")
        if not (isinstance(self.confidence, (int, float)) and 0.5 <= self.confidence < 1):
            raise BenchError(f"confidence={self.confidence!r} is out of range; allowed: [0.5, 1)")
        if not (isinstance(self.drain_tolerance, (int, float)) and 0 < self.drain_tolerance < 1):
            raise BenchError(f"drain_tolerance={self.drain_tolerance!r} is out of range; allowed: (0, 1)")


@dataclass(frozen=True)
class SteadyStateEstimate:
    """Batch-means estimate of steady-state output throughput (tokens/s, server time)."""

    throughput: float
    half_width: float
    windows: int
    """Complete windows observed."""
    batches: int
    """Batches (consecutive windows summed) the interval is computed over."""
    window_s: float
    confidence: float
    saturated_from_s: float
    """Seconds (server time) from the start of the measured run to the first window."""
    full_run_low: float | None = None
    full_run_high: float | None = None
    """Bounds on the output throughput the whole run would have had (:func:`full_run_throughput_bounds`),
    set when the rule stopped the run; the reported figure is their midpoint."""
    drain_model: dict | None = None
    """The measured :class:`StepTimeModel` the bounds were computed with (``None``: model-free bounds)."""

    @property
    def rel_half_width(self) -> float:
        return self.half_width / self.throughput if self.throughput > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["rel_half_width"] = self.rel_half_width
        return out


def predict_full_run_end(
    now: float,
    in_flight_remaining: Sequence[float],
    queued_lengths: Sequence[float],
    concurrency: int,
    per_sequence_rate: float,
    startup_s: float,
) -> float:
    """When a closed-loop run ends if every running sequence keeps decoding at ``per_sequence_rate``
    (a fluid model): when one finishes, the next queued request takes its slot after ``startup_s``
    (its time to first token). Pure."""
    import heapq

    if per_sequence_rate <= 0:
        return math.inf
    slots = [now + max(0.0, r) / per_sequence_rate for r in in_flight_remaining]
    slots += [now] * max(0, concurrency - len(slots))
    heapq.heapify(slots)
    end = max(slots, default=now)
    for length in queued_lengths:
        t = heapq.heappop(slots) + startup_s + length / per_sequence_rate
        end = max(end, t)
        heapq.heappush(slots, t)
    return end


@dataclass(frozen=True)
class StepTimeModel:
    """Measured decode-step time of the engine, from the observed stream only (no engine internals).

    ``step(k, C) = alpha + gamma * C - (f(c) - f(k))``: seconds per decode step with ``k`` sequences
    running and ``C`` tokens of context among them, ``c`` the benchmark's concurrency.

    - ``alpha``, ``gamma`` (and a prefill term, not used in the drain) are fitted by least squares over
      windows of the measured run itself while ``c`` sequences run (the first wave's growing contexts
      and the steady state's turnover give ``C`` its range): mean inter-chunk gap ~ step time.
    - ``f(k)`` is the measured step time at ``k`` running sequences from the occupancy probe (``c``
      short requests of staggered lengths sent before measuring, so occupancy falls from ``c`` to 1
      the way it does in a drain), corrected to common context with ``gamma``; made non-decreasing in
      ``k`` (more sequences never make a step faster). MoE engines have a strongly concave ``f``
      (experts' weights are shared), so it is used as measured, not as a straight line.
    - ``tokens_per_step`` by output position (speculative decoding accepts more late in an output).

    Each part carries its standard error; :meth:`step` with ``z`` gives the bounds the rule uses.
    """

    concurrency: int
    alpha: float
    gamma: float
    cov: tuple[tuple[float, float], tuple[float, float]]
    """Covariance of (alpha, gamma)."""
    occupancy_step: tuple[float, ...]
    """f(k) for k = 1..concurrency (seconds, context-corrected, non-decreasing)."""
    occupancy_se: tuple[float, ...]
    position_bin: float
    tokens_per_step: tuple[float, ...]
    """Mean tokens per chunk by output-position bin of width ``position_bin``."""

    def step(self, k: int, context: float, z: float = 0.0) -> float:
        """Step time with ``k`` running sequences and ``context`` tokens among them; ``z`` standard
        errors above (``z > 0``) or below the estimate."""
        c = self.concurrency
        k = max(1, min(int(k), c))
        (vaa, vag), (_, vgg) = self.cov
        var_fit = max(0.0, vaa + 2 * context * vag + context * context * vgg)
        var_occ = self.occupancy_se[k - 1] ** 2 + self.occupancy_se[c - 1] ** 2 if k < c else 0.0
        s = self.alpha + self.gamma * context - (self.occupancy_step[c - 1] - self.occupancy_step[k - 1])
        s += z * math.sqrt(var_fit + var_occ)
        return max(s, 0.25 * self.occupancy_step[0], 1e-9)

    def tokens_at(self, position: float) -> float:
        i = min(max(int(position / self.position_bin), 0), len(self.tokens_per_step) - 1)
        return self.tokens_per_step[i]

    def to_dict(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "gamma": self.gamma,
                "f_1": self.occupancy_step[0], "f_c": self.occupancy_step[-1],
                "tokens_per_step_first": self.tokens_per_step[0], "tokens_per_step_last": self.tokens_per_step[-1]}


def _isotonic(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """Non-decreasing least-squares fit (pool adjacent violators). Pure."""
    blocks: list[list[float]] = []  # [value, weight, count]
    for v, w in zip(values, weights):
        blocks.append([float(v), float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    out: list[float] = []
    for v, _, n in blocks:
        out += [v] * int(n)
    return out


def fit_occupancy_curve(
    streams: Sequence[tuple[float, Sequence[tuple[float, float]]]], concurrency: int
) -> tuple[list[float], list[float], list[float]] | None:
    """Step time by running sequences from the probe's streams. Pure.

    Args:
        streams: per probe request, ``(prompt_len, [(t, tokens), ...])`` -- every chunk with text,
            the first one being the first token.
        concurrency: ``c``; the curve is returned for ``k = 1..c``.

    Returns:
        ``(mean gap, standard error, mean context)`` per ``k`` (gaps only after every probe request
        has its first token, so no step holds a prefill), or ``None`` when fewer than half the
        levels were seen. Missing levels are interpolated; the standard error counts one sample per
        step (the ``k`` gaps of one step are one observation).
    """
    live = [(p, ev) for p, ev in streams if len(ev) >= 2]
    if not live:
        return None
    starts = np.array([ev[0][0] for _, ev in live])
    ends = np.array([ev[-1][0] for _, ev in live])
    after = float(starts.max())
    sums = np.zeros(concurrency + 1)
    sq = np.zeros(concurrency + 1)
    cnt = np.zeros(concurrency + 1)
    ctx = np.zeros(concurrency + 1)
    # Context of every request at any time: prompt + tokens before then (step function).
    times = [np.array([t for t, _ in ev]) for _, ev in live]
    cums = [np.cumsum([n for _, n in ev]) for _, ev in live]
    prompts = [p for p, _ in live]
    for j, (_, ev) in enumerate(live):
        for i in range(1, len(ev)):
            t, gap = ev[i][0], ev[i][0] - ev[i - 1][0]
            if ev[i - 1][0] < after or gap <= 0:
                continue
            running = (starts < t) & (ends >= t)
            k = int(running.sum())
            if not 1 <= k <= concurrency:
                continue
            c_tot = 0.0
            for m in np.flatnonzero(running):
                idx = int(np.searchsorted(times[m], t, side="left"))  # tokens before this step
                c_tot += prompts[m] + (float(cums[m][idx - 1]) if idx > 0 else 0.0)
            sums[k] += gap
            sq[k] += gap * gap
            cnt[k] += 1
            ctx[k] += c_tot
    seen = [k for k in range(1, concurrency + 1) if cnt[k] > 0]
    if len(seen) < max(2, concurrency // 2):
        return None
    mean = {k: sums[k] / cnt[k] for k in seen}
    steps = {k: max(1.0, cnt[k] / k) for k in seen}
    se = {}
    for k in seen:
        var = max(0.0, sq[k] / cnt[k] - mean[k] ** 2)
        se[k] = math.sqrt(var / steps[k]) if steps[k] > 1 else mean[k] * 0.1
    mc = {k: ctx[k] / cnt[k] for k in seen}
    ks = np.arange(1, concurrency + 1)
    xs = np.array(seen, dtype=float)
    interp = lambda d: list(np.interp(ks, xs, [d[k] for k in seen]))  # noqa: E731
    m, s, c = interp(mean), interp(se), interp(mc)
    # Interpolated levels get the wider neighbour's error.
    return m, [max(v, se[min(seen, key=lambda q: abs(q - k))]) for k, v in zip(ks, s)], c


def fit_step_model(
    windows: Sequence[tuple[float, float, float, float]],
    occupancy: tuple[Sequence[float], Sequence[float], Sequence[float]],
    positions: tuple[float, Sequence[float]],
    concurrency: int,
) -> StepTimeModel | None:
    """Least-squares step-time model (see :class:`StepTimeModel`). Pure.

    Args:
        windows: per window of the measured run with all ``concurrency`` slots decoding:
            ``(mean gap, mean context, prefills per step, chunks)``.
        occupancy: :func:`fit_occupancy_curve`'s result.
        positions: ``(bin width, tokens per chunk by bin)``.
    Returns ``None`` when there are too few windows (< 6) or the fit is degenerate.
    """
    rows = [w for w in windows if w[3] > 0]
    if len(rows) < 6:
        return None
    y = np.array([w[0] for w in rows])
    x = np.column_stack([np.ones(len(rows)), [w[1] for w in rows], [w[2] for w in rows]])
    if not np.any(x[:, 2] > 0):
        x = x[:, :2]
    try:
        xtx_inv = np.linalg.inv(x.T @ x)
    except np.linalg.LinAlgError:
        return None
    beta = xtx_inv @ x.T @ y
    resid = y - x @ beta
    dof = len(rows) - x.shape[1]
    if dof < 3:
        return None
    cov = xtx_inv * float(resid @ resid) / dof
    mean, se, ctx = occupancy
    c = concurrency
    gamma = float(beta[1])
    corrected = [m - gamma * (cx - ctx[c - 1]) for m, cx in zip(mean, ctx)]  # to the probe's context at k=c
    f = _isotonic(corrected, [1.0 / max(s, 1e-12) ** 2 for s in se])
    width, tps = positions
    if not tps:
        return None
    return StepTimeModel(
        concurrency=c, alpha=float(beta[0]), gamma=gamma,
        cov=((float(cov[0, 0]), float(cov[0, 1])), (float(cov[1, 0]), float(cov[1, 1]))),
        occupancy_step=tuple(f), occupancy_se=tuple(se), position_bin=float(width),
        tokens_per_step=tuple(float(v) for v in tps),
    )


def predict_drain_end(start: float, sequences: Sequence[tuple[float, float, float]], model: StepTimeModel,
                      z: float = 0.0, max_jump: int = 64) -> float:
    """When the last of ``sequences`` ``(remaining tokens, output position, prompt tokens)`` finishes
    if nothing new starts: step by step with :meth:`StepTimeModel.step` (``z`` standard errors
    slower) as occupancy falls and contexts grow; finishes are jumped to in at most ``max_jump``
    steps at a time. Pure."""
    rem = np.array([s[0] for s in sequences if s[0] > 0], dtype=float)
    pos = np.array([s[1] for s in sequences if s[0] > 0], dtype=float)
    ctx = np.array([s[1] + s[2] for s in sequences if s[0] > 0], dtype=float)
    t = start
    while rem.size:
        tau = np.array([model.tokens_at(p) for p in pos])
        steps = max(1, min(max_jump, int(math.ceil(float(np.min(rem / tau))))))
        grow = steps * float(tau.sum())
        t += steps * model.step(rem.size, float(ctx.sum()) + grow / 2, z)
        rem -= steps * tau
        pos += steps * tau
        ctx += steps * tau
        keep = rem > 1e-9
        rem, pos, ctx = rem[keep], pos[keep], ctx[keep]
    return t


def _drain_start_state(
    now: float,
    in_flight: Sequence[tuple[float, float, float]],
    queued: Sequence[tuple[float, float]],
    concurrency: int,
    per_sequence_rate: float,
    startup_s: float,
) -> tuple[float, list[tuple[float, float, float]]]:
    """The closed loop at the steady per-sequence rate until the last queued request starts: that
    time and every running sequence's ``(remaining, position, prompt)`` then. Pure."""
    import heapq

    slots = [(now + max(0.0, r) / per_sequence_rate, r + p, pr) for r, p, pr in in_flight]
    slots += [(now, 0.0, 0.0)] * max(0, concurrency - len(slots))
    heapq.heapify(slots)
    t_last = now
    for length, prompt in queued:
        end, _, _ = heapq.heappop(slots)
        t_last = end + startup_s
        heapq.heappush(slots, (t_last + length / per_sequence_rate, float(length), float(prompt)))
    state = []
    for end, length, prompt in slots:
        remaining = (end - t_last) * per_sequence_rate
        if remaining > 0:
            state.append((remaining, length - remaining, prompt))
    return t_last, state


def full_run_throughput_bounds(
    *,
    now: float,
    t0: float,
    in_flight_remaining: Sequence[float],
    queued_lengths: Sequence[float],
    total_tokens: float,
    concurrency: int,
    steady_throughput: float,
    startup_s: float,
    step_model: StepTimeModel | None = None,
    in_flight_positions: Sequence[float] | None = None,
    in_flight_prompts: Sequence[float] | None = None,
    queued_prompts: Sequence[float] | None = None,
    z: float = 2.0,
) -> tuple[float, float]:
    """Bounds on the output throughput (tokens per unit of ``now``'s clock) of the whole run.

    Until the last request starts, the run goes on at the steady-state rate (each sequence at the
    steady per-sequence rate, closed loop). What is unknown is the final drain, when fewer than
    ``concurrency`` sequences are left and each runs faster than in the full batch.

    Without ``step_model`` the bounds are model-free and wide: every sequence keeps the steady
    per-sequence rate to the end (:func:`predict_full_run_end`), or the drain keeps the whole
    steady-state throughput. With a :class:`StepTimeModel` the drain is predicted step by step
    (:func:`predict_drain_end`) at ``z`` standard errors of the model's step times either way. With
    ``ignore_eos`` the remaining work is known exactly.
    """
    remaining = float(sum(in_flight_remaining) + sum(queued_lengths))
    if steady_throughput <= 0:
        return 0.0, 0.0
    rate = steady_throughput / concurrency
    if step_model is None:
        slow_end = predict_full_run_end(now, in_flight_remaining, queued_lengths, concurrency, rate, startup_s)
        fast_end = now + remaining / steady_throughput
    else:
        n = len(in_flight_remaining)
        flight = list(zip(in_flight_remaining, in_flight_positions or [0.0] * n, in_flight_prompts or [0.0] * n))
        queue = list(zip(queued_lengths, queued_prompts or [0.0] * len(queued_lengths)))
        start, state = _drain_start_state(now, flight, queue, concurrency, rate, startup_s)
        slow_end = predict_drain_end(start, state, step_model, z)
        fast_end = predict_drain_end(start, state, step_model, -z)
    low = total_tokens / (slow_end - t0) if slow_end > t0 else 0.0
    high = total_tokens / (fast_end - t0) if fast_end > t0 else 0.0
    return low, high


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


# ----- pure helpers -------------------------------------------------------------------------------


def parse_spec_counters(metrics_text: str) -> dict[str, float]:
    """The ``lmdeploy:spec_decode_*`` counters in a Prometheus text page (summed over labels).

    Matches *samples* by name: the parser strips ``_total`` from counter *family* names, but the
    samples keep it.
    """
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {v: k for k, v in SPEC_COUNTER_NAMES.items()}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            key = wanted.get(sample.name)
            if key is not None:
                out[key] = out.get(key, 0.0) + float(sample.value)
    return out


def _parse_gauge(metrics_text: str, name: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return None


def accept_length_from_counters(delta: Mapping[str, float], num_draft_tokens: int | None) -> float | None:
    """``1 + Δaccepted / (Δdraft_tokens / N)``; ``None`` when no draft tokens were counted.

    ``N`` (draft tokens per draft step) comes from the engine config when known; otherwise from
    ``Δdraft_tokens / Δdrafts`` (the engine counts one draft per step), i.e. accept length =
    ``1 + Δaccepted / Δdrafts``.
    """
    draft_tokens = float(delta.get("num_draft_tokens", 0.0))
    accepted = float(delta.get("num_accepted_tokens", 0.0))
    if draft_tokens <= 0:
        return None
    if num_draft_tokens:
        steps = draft_tokens / num_draft_tokens
    else:
        steps = float(delta.get("num_drafts", 0.0))
        if steps <= 0:
            return None
    return 1.0 + accepted / steps


def _t_quantile(p: float, df: int) -> float:
    """Student-t quantile (Abramowitz & Stegun 26.7.5 expansion; < 1e-3 relative error for df >= 3).

    Keeps scipy out of the dependencies for one number.
    """
    z = statistics.NormalDist().inv_cdf(p)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


class _SteadyStateTracker:
    """Output tokens per fixed window while saturated, and the batch-means interval over windows.

    Pure bookkeeping over timestamps given by the caller (wall seconds); no clock of its own.
    """

    def __init__(self, rule: SteadyStateRule, time_scale: float, t0: float) -> None:
        self.rule = rule
        self.time_scale = time_scale
        self.window_wall_s = rule.window_s / time_scale
        self.t0 = t0
        self.start_at: float | None = None
        self.end_at: float | None = None
        self.counts: list[float] = []
        self.stopped_with: SteadyStateEstimate | None = None

    @property
    def active(self) -> bool:
        return self.start_at is not None and self.end_at is None

    def start(self, t: float) -> None:
        if self.start_at is None and self.end_at is None:
            self.start_at = t

    def end(self, t: float) -> None:
        if self.end_at is None:
            self.end_at = t

    def add_tokens(self, t: float, n: float) -> None:
        if not self.active or t < self.start_at:  # type: ignore[operator]
            return
        i = int((t - self.start_at) / self.window_wall_s)  # type: ignore[operator]
        while len(self.counts) <= i:
            self.counts.append(0.0)
        self.counts[i] += n

    def complete_windows(self, now: float) -> list[float]:
        if self.start_at is None:
            return []
        horizon = now if self.end_at is None else min(now, self.end_at)
        n = int((horizon - self.start_at) / self.window_wall_s)
        return (self.counts + [0.0] * max(0, n - len(self.counts)))[:n]

    def estimate(self, now: float) -> SteadyStateEstimate | None:
        """Batch means over the complete windows so far.

        The windows are grouped into ``k = max(min_windows, isqrt(n))`` batches of equal size (the
        oldest leftover windows, nearest the ramp-up, are dropped). Growing batches keep the
        interval honest both when windows are positively correlated (slow drifts) and when they are
        negatively correlated (tokens stamped into a neighbouring window by client or network
        jitter), which a fixed window length would not.
        """
        windows = self.complete_windows(now)
        if len(windows) < 2 or self.start_at is None:
            return None
        k = min(len(windows), max(self.rule.min_windows, math.isqrt(len(windows))))
        size = len(windows) // k
        used = np.asarray(windows[len(windows) - k * size:], dtype=float)
        rates = used.reshape(k, size).sum(axis=1) / (size * self.rule.window_s)  # tokens per server-time second
        mean = float(np.mean(rates))
        sd = float(np.std(rates, ddof=1))
        t = _t_quantile(0.5 + self.rule.confidence / 2, k - 1)
        return SteadyStateEstimate(
            throughput=mean,
            half_width=t * sd / math.sqrt(k),
            windows=len(windows),
            batches=k,
            window_s=self.rule.window_s,
            confidence=self.rule.confidence,
            saturated_from_s=(self.start_at - self.t0) * self.time_scale,
        )

    def converged(self, now: float) -> SteadyStateEstimate | None:
        est = self.estimate(now)
        if est is None or est.batches < self.rule.min_windows or est.throughput <= 0:
            return None
        if est.rel_half_width > self.rule.rel_tolerance:
            return None
        # Trend guard: a throughput still drifting (contexts growing, a queue filling) can have a
        # tight interval around a moving mean; require the two halves to agree within tolerance.
        windows = self.complete_windows(now)
        half = len(windows) // 2
        first, second = float(np.mean(windows[:half])), float(np.mean(windows[half:]))
        if abs(second - first) > self.rule.rel_tolerance * max(first, second):
            return None
        return est


# ----- server probing -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerInfo:
    """What the bench learned about the server before measuring."""

    model: str
    simulated: bool
    time_scale: float
    engine: str
    sim_info: dict | None = None
    sim_clock: SimClock | None = None


DELIVERY_LAG_S = 0.05
"""Wall seconds by which stamped simulator tokens may arrive after their time (its delivery quantum
is 5 ms; the rest is margin for a loaded machine)."""


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

    def local(self, sim_t: float) -> float:
        return self.monotonic_start + float(sim_t) / self.time_scale


async def _probe_server(session: aiohttp.ClientSession, base_url: str) -> ServerInfo:
    url = f"{base_url}/v1/models"
    timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
    try:
        async with session.get(url, timeout=timeout) as resp:
            if resp.status != 200:
                body = (await resp.text())[:300]
                raise ServerUnreachableError(
                    f"GET {url} answered HTTP {resp.status}: {body!r}; is this an OpenAI-compatible server "
                    "(and is --api-key right)?"
                )
            header_sim = resp.headers.get(SIM_HEADER, "").lower() == "true"
            models = await resp.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        raise ServerUnreachableError(
            f"cannot reach the server at {base_url} (GET /v1/models: {type(e).__name__}: {e}); "
            "start it or fix --base-url"
        ) from None
    except json.JSONDecodeError:
        raise ServerUnreachableError(f"GET {url} did not return JSON; is this an OpenAI-compatible server?") from None
    data = models.get("data") if isinstance(models, Mapping) else None
    if not data or not isinstance(data, list) or not isinstance(data[0], Mapping) or "id" not in data[0]:
        raise ServerUnreachableError(f"GET {url} lists no model ({models!r:.200}); is the engine fully started?")
    model = str(data[0]["id"])
    owned_by = str(data[0].get("owned_by") or "")

    sim_info: dict | None = None
    try:
        async with session.get(f"{base_url}/sim/info", timeout=timeout) as resp:
            if resp.status == 200:
                got = await resp.json(content_type=None)
                if isinstance(got, Mapping) and got.get("simulated"):
                    sim_info = dict(got)
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError, OSError):
        pass
    simulated = sim_info is not None or header_sim or owned_by == "simulator"
    time_scale = 1.0
    if sim_info is not None and sim_info.get("time_scale"):
        time_scale = float(sim_info["time_scale"])
    elif simulated:
        text = await _get_metrics_text(session, base_url)
        gauge = _parse_gauge(text, "sim_time_scale") if text else None
        time_scale = gauge or 1.0
    engine = "sim" if simulated else (owned_by or "unknown")
    sim_clock = None
    if (
        sim_info is not None
        and sim_info.get("monotonic_start") is not None
        and sim_info.get("boot_id") is not None
        and sim_info.get("boot_id") == host_boot_id()
    ):
        sim_clock = SimClock(float(sim_info["monotonic_start"]), time_scale)
    return ServerInfo(model=model, simulated=simulated, time_scale=time_scale, engine=engine, sim_info=sim_info,
                      sim_clock=sim_clock)


async def _get_metrics_text(session: aiohttp.ClientSession, base_url: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    try:
        async with session.get(f"{base_url}/metrics", timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                return None
            return await resp.text()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return None


async def _scrape_spec_counters(
    session: aiohttp.ClientSession, base_url: str, timeout_s: float = PROBE_TIMEOUT_S
) -> dict[str, float] | None:
    text = await _get_metrics_text(session, base_url, timeout_s)
    if text is None:
        return None
    try:
        return parse_spec_counters(text)
    except Exception as e:  # noqa: BLE001 - a malformed page loses the accept length, not the run
        logger.warning("could not parse %s/metrics: %s; accept length will be missing", base_url, e)
        return None


# ----- one request --------------------------------------------------------------------------------


class _RequestState:
    """Mutable progress of one in-flight request; frozen into a :class:`RequestOutput` at the end."""

    __slots__ = ("index", "spec", "started_at", "ttft", "itl", "last_at", "tokens", "usage_tokens", "text_parts", "done")

    def __init__(self, index: int, spec: RequestSpec) -> None:
        self.index = index
        self.spec = spec
        self.started_at: float | None = None
        self.ttft: float | None = None
        self.itl: list[float] = []
        self.last_at: float | None = None
        self.tokens = 0.0
        self.usage_tokens: int | None = None
        self.text_parts: list[str] = []
        self.done = False

    def freeze(self, *, success: bool, kind: str | None, error: str, counter: TokenCounter, now: float) -> RequestOutput:
        started = self.started_at if self.started_at is not None else now
        if self.usage_tokens is not None:
            out_len = self.usage_tokens
        else:
            out_len = counter.count_tokens("".join(self.text_parts)) if self.text_parts else 0
        end = self.last_at if (success and self.last_at is not None) else now
        return RequestOutput(
            index=self.index,
            success=success,
            error_kind=kind,
            error=error,
            ttft=self.ttft,
            itl=tuple(self.itl),
            latency=end - started,
            prompt_len=self.spec.prompt_len,
            output_len=int(out_len),
            started_at=started,
            finished_at=now,
            last_token_at=self.last_at,
        )


class _Hooks:
    """Callbacks from a request to the run (saturation bookkeeping); no-ops for warm-up."""

    def on_first_token(self, state: _RequestState, t: float) -> None:
        pass

    def on_tokens(self, t: float, n: float) -> None:
        pass

    def on_chunk(self, state: _RequestState, t: float, n: float, gap: float | None) -> None:
        """A chunk with ``n`` tokens at ``t``; ``gap`` since the request's previous chunk (``None``
        for the first token). Called before ``state.tokens`` counts it."""


def _payload(w: Workload, model: str, spec: RequestSpec, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": w.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": w.ignore_eos,
    }
    if w.api == "chat":
        body["messages"] = [{"role": "user", "content": spec.prompt}]
    else:
        body["prompt"] = spec.prompt
    return body


def _chunk_text(obj: Mapping[str, Any], api: str) -> str:
    choices = obj.get("choices") or []
    if not choices or not isinstance(choices[0], Mapping):
        return ""
    c = choices[0]
    if api == "chat":
        delta = c.get("delta") or {}
        return (delta.get("content") or "") + (delta.get("reasoning_content") or "")
    return c.get("text") or ""


async def _send(
    session: aiohttp.ClientSession,
    url: str,
    w: Workload,
    model: str,
    state: _RequestState,
    counter: TokenCounter,
    hooks: _Hooks,
    timeout: aiohttp.ClientTimeout,
    max_tokens: int,
    clock: SimClock | None = None,
    sim_hold: bool = False,
) -> RequestOutput:
    """Send one streaming request; every failure becomes a :class:`RequestOutput` (cancellation
    propagates: the caller records the partial state)."""
    payload = _payload(w, model, state.spec, max_tokens)
    if sim_hold:
        payload["sim_hold"] = True  # closed loop on the simulator: see SimClock
    state.started_at = time.monotonic()
    got_done = False
    try:
        async with session.post(url, json=payload, timeout=timeout) as resp:
            if resp.status != 200:
                body = (await resp.text())[:500]
                return state.freeze(success=False, kind=f"HTTP {resp.status}", error=body, counter=counter, now=time.monotonic())
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue  # blank separators, SSE comments / keep-alives, event: lines
                data = line[5:].strip()
                if data == b"[DONE]":
                    got_done = True
                    break
                obj = json.loads(data)
                if not isinstance(obj, Mapping):
                    continue
                if obj.get("error"):
                    return state.freeze(
                        success=False, kind="stream error", error=str(obj["error"])[:500], counter=counter, now=time.monotonic()
                    )
                usage = obj.get("usage")
                prev_usage = state.usage_tokens
                if isinstance(usage, Mapping) and usage.get("completion_tokens") is not None:
                    state.usage_tokens = int(usage["completion_tokens"])
                text = _chunk_text(obj, w.api)
                if not text:
                    continue
                sim = obj.get("sim") if clock is not None else None
                if isinstance(sim, Mapping) and sim.get("token_times"):
                    # Simulator: one token event per engine step, at its simulated time (SimClock).
                    if state.ttft is None and sim.get("arrival") is not None:
                        state.started_at = clock.local(sim["arrival"])  # type: ignore[union-attr]
                    events = [(clock.local(t), float(n)) for t, n in sim["token_times"]]  # type: ignore[union-attr]
                else:
                    now = time.monotonic()
                    if state.usage_tokens is not None and prev_usage is not None and state.usage_tokens > prev_usage:
                        n = float(state.usage_tokens - prev_usage)  # servers that report cumulative usage per chunk
                    else:
                        n = float(max(1, counter.count_tokens(text)))
                    events = [(now, n)]
                for now, n in events:
                    if state.ttft is None:
                        state.ttft = now - state.started_at
                        hooks.on_first_token(state, now)
                        hooks.on_chunk(state, now, n, None)
                    else:
                        state.itl.append(now - state.last_at)  # type: ignore[operator]
                        hooks.on_chunk(state, now, n, now - state.last_at)  # type: ignore[operator]
                    state.last_at = now
                    state.tokens += n
                    hooks.on_tokens(now, n)
                state.text_parts.append(text)
    except asyncio.TimeoutError:
        return state.freeze(
            success=False, kind="timeout", error=f"no complete response within {timeout.total} s", counter=counter, now=time.monotonic()
        )
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
        return state.freeze(success=False, kind="connection", error=f"{type(e).__name__}: {e}", counter=counter, now=time.monotonic())
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
        return state.freeze(success=False, kind="bad response", error=f"{type(e).__name__}: {e}", counter=counter, now=time.monotonic())
    except aiohttp.ClientError as e:
        return state.freeze(success=False, kind="client error", error=f"{type(e).__name__}: {e}", counter=counter, now=time.monotonic())
    if not got_done:
        return state.freeze(
            success=False, kind="incomplete stream", error="the stream ended without [DONE]", counter=counter, now=time.monotonic()
        )
    if state.ttft is None:
        return state.freeze(success=False, kind="empty response", error="no text was streamed", counter=counter, now=time.monotonic())
    return state.freeze(success=True, kind=None, error="", counter=counter, now=time.monotonic())


# ----- the run ------------------------------------------------------------------------------------


class _RunHooks(_Hooks):
    """Saturation bookkeeping for the steady-state rule.

    Steady state starts after one full turnover: once the first ``concurrency`` requests have
    *finished* while requests are still waiting for a slot. Before that every running sequence is at
    the same early stage (short contexts, cheap decode steps), so throughput is transiently high;
    for 16k-token outputs the first wave alone would overstate it by ~10%. It ends when a request
    finishes and nothing is left to take its slot (the drain at the end of a run).
    """

    def __init__(self, total: int, concurrency: int | None, tracker: _SteadyStateTracker | None) -> None:
        self.total = total
        self.concurrency = concurrency
        self.tracker = tracker
        self.started = 0
        self.finished = 0
        self.latest = -math.inf  # newest token time seen
        self.stats: _StreamStats | None = None
        self.seen_token = False

    def on_slot(self, state: _RequestState) -> None:
        self.started += 1

    def on_tokens(self, t: float, n: float) -> None:
        self.latest = max(self.latest, t)
        if self.tracker is not None:
            self.tracker.add_tokens(t, n)

    def on_first_token(self, state: _RequestState, t: float) -> None:
        if self.tracker is not None and not self.seen_token and state.started_at is not None:
            self.tracker.t0 = state.started_at  # the token clock's run start (SimClock may lag the wall)
        self.seen_token = True
        if self.stats is not None:
            self.stats.on_first_token(state.spec.prompt_len, t)

    def on_chunk(self, state: _RequestState, t: float, n: float, gap: float | None) -> None:
        if self.stats is not None:
            self.stats.on_chunk(state.tokens, t, n, gap)

    def on_finish(self, state: _RequestState, t: float) -> None:
        self.finished += 1
        if self.stats is not None and state.ttft is not None:
            self.stats.on_finish(state.spec.prompt_len + state.tokens)
        if self.tracker is None or self.concurrency is None:
            return
        if self.finished == self.concurrency and self.started < self.total:
            self.tracker.start(t)
        if self.started >= self.total:
            self.tracker.end(t)


class _StreamStats:
    """What the step-time model is fitted on, accumulated online from the measured stream (O(1) per
    chunk): per time bin the mean gap between a request's chunks (~ one decode step), the running
    sequences and their total context at each chunk, the prompt tokens prefilled; per output-position
    bin the tokens per chunk. Times are the caller's (wall or sim-mapped) seconds."""

    def __init__(self, t0: float | None, bin_s: float, position_bin: float, n_position_bins: int = 32) -> None:
        self.t0 = t0
        self.bin_s = bin_s
        self.position_bin = max(1.0, position_bin)
        self.running = 0
        self.context = 0.0
        self.bins: list[list[float]] = []  # [sum gap, chunks, sum context, sum running, first tokens]
        self.pos_tokens = [0.0] * n_position_bins
        self.pos_chunks = [0.0] * n_position_bins

    def _bin(self, t: float) -> list[float]:
        if self.t0 is None:
            self.t0 = t  # bins start at the first token: token clocks (SimClock) can lag the wall clock
        i = max(0, int((t - self.t0) / self.bin_s))
        while len(self.bins) <= i:
            self.bins.append([0.0, 0.0, 0.0, 0.0, 0.0])
        return self.bins[i]

    def on_first_token(self, prompt_len: int, t: float) -> None:
        self.running += 1
        self.context += prompt_len
        self._bin(t)[4] += 1

    def on_chunk(self, position: float, t: float, n: float, gap: float | None) -> None:
        if gap is not None and gap > 0:
            b = self._bin(t)
            b[0] += gap
            b[1] += 1
            b[2] += self.context
            b[3] += self.running
            j = min(int(position / self.position_bin), len(self.pos_tokens) - 1)
            self.pos_tokens[j] += n
            self.pos_chunks[j] += 1
        self.context += n

    def on_finish(self, context: float) -> None:
        self.running -= 1
        self.context -= context

    def windows(self, now: float, concurrency: int) -> list[tuple[float, float, float, float]]:
        """Complete bins with (nearly) every slot decoding: ``(mean gap, mean context, prefills per
        step, chunks)``. A prefill costs a step much more than its share of tokens (a prefill reads
        all the weights), so it enters as a count: requests whose first token came in the bin."""
        if self.t0 is None:
            return []
        done = int((now - self.t0) / self.bin_s)
        out = []
        for gap, chunks, ctx, run, prefill in self.bins[:done]:
            if chunks < 2 * concurrency or run / chunks < concurrency - 1:
                continue
            mean_gap = gap / chunks
            steps = chunks / (run / chunks)
            if prefill / steps > 0.5:
                continue  # the ramp-up: prompts prefilled many per step, not one prefill per step
            out.append((mean_gap, ctx / chunks, prefill / steps, chunks))
        return out

    def positions(self) -> tuple[float, list[float]]:
        """Tokens per chunk by position bin (bins with no chunk take their nearest neighbour's)."""
        known = [(i, t / c) for i, (t, c) in enumerate(zip(self.pos_tokens, self.pos_chunks)) if c > 0]
        if not known:
            return self.position_bin, []
        out = [min(known, key=lambda kv: abs(kv[0] - i))[1] for i in range(len(self.pos_tokens))]
        return self.position_bin, out


class _ProbeHooks(_Hooks):
    """Records every chunk of the occupancy probe's requests."""

    def __init__(self) -> None:
        self.events: dict[int, list[tuple[float, float]]] = {}

    def on_chunk(self, state: _RequestState, t: float, n: float, gap: float | None) -> None:
        self.events.setdefault(state.index, []).append((t, n))


PROBE_MIN_TOKENS = 96
"""The occupancy probe's shortest request: long enough that every probe request is decoding at once
for a while after the prefills (the full-occupancy level must be seen)."""
PROBE_SPAN_TOKENS = 768
"""The occupancy probe's longest request is this many tokens longer than its shortest."""


def occupancy_probe_lengths(concurrency: int, max_output_len: int) -> list[int]:
    """Output lengths of the occupancy probe's ``concurrency`` requests: staggered evenly so the
    running sequences fall from ``concurrency`` to 1 one at a time, a few steps per level. Pure."""
    lo = min(PROBE_MIN_TOKENS, max_output_len)
    span = max(0, min(PROBE_SPAN_TOKENS, max_output_len - lo))
    if concurrency <= 1:
        return [lo + span]
    return [lo + round(j * span / (concurrency - 1)) for j in range(concurrency)]


async def _probe_occupancy(
    session: aiohttp.ClientSession,
    url: str,
    w: Workload,
    model: str,
    specs: list[RequestSpec],
    counter: TokenCounter,
    timeout: aiohttp.ClientTimeout,
    clock: SimClock | None,
    concurrency: int,
) -> tuple[list[float], list[float], list[float]] | None:
    """Measure step time against running sequences before the measured run (not counted): send
    ``concurrency`` requests of :func:`occupancy_probe_lengths` at once and fit
    :func:`fit_occupancy_curve` on their chunks."""
    lengths = occupancy_probe_lengths(concurrency, max(s.output_len for s in specs))
    hooks = _ProbeHooks()
    states = [_RequestState(-1000 - j, specs[j % len(specs)]) for j in range(len(lengths))]
    outs = await asyncio.gather(*(
        _send(session, url, w, model, st, counter, hooks, timeout, n, clock) for st, n in zip(states, lengths)
    ))
    if any(not o.success for o in outs):
        logger.warning("occupancy probe: %d of %d requests failed; early stop will use model-free bounds",
                       sum(not o.success for o in outs), len(outs))
        return None
    streams = [(float(st.spec.prompt_len), hooks.events.get(st.index, [])) for st in states]
    return fit_occupancy_curve(streams, concurrency)


def _versions(info: ServerInfo) -> dict[str, str]:
    try:
        from importlib.metadata import version

        ours = version("mtp-autotune")
    except Exception:  # noqa: BLE001 - not installed (running from a checkout)
        ours = "0.1.0+checkout"
    out = {"mtp_autotune": ours, "python": platform.python_version(), "engine": info.engine}
    if info.sim_info is not None:
        out["sim_profile"] = str(info.sim_info.get("profile", "unknown"))
    return out


async def run_benchmark(
    base_url: str,
    workload: Workload,
    *,
    model: str | None = None,
    tokenizer: Any = None,
    engine_config: EngineConfig | None = None,
    steady_state: SteadyStateRule | None = None,
    progress: BenchProgress | None = None,
    request_timeout_s: float = 3600,
    api_key: str | None = None,
    num_draft_tokens: int | None = None,
) -> BenchResult:
    """Run ``workload`` against the server at ``base_url`` and measure it.

    Args:
        base_url: ``http://host:port`` of an OpenAI-compatible server.
        workload: what to send.
        model: model name in requests; ``None`` = the first model ``/v1/models`` lists.
        tokenizer: token counter for prompts and outputs without usage (see :func:`build_requests`).
        engine_config: the config the server runs (recorded; gives ``N`` for the accept length).
        steady_state: stop early once steady-state output throughput is known (module docstring).
        progress: event sink (e.g. :class:`~tuning.progress.RichProgress`); its errors are logged.
        request_timeout_s: per-request wall-clock limit; a request over it fails as ``timeout``.
        api_key: sent as ``Authorization: Bearer``.
        num_draft_tokens: ``N`` for the accept length when no ``engine_config`` is given.

    Raises:
        ServerUnreachableError: ``GET /v1/models`` failed. Single request failures never raise.
    """
    base_url = base_url.rstrip("/")
    sink = SafeProgress(progress)
    counter = resolve_token_counter(tokenizer)
    concurrency = workload.max_concurrency
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    connector = aiohttp.TCPConnector(limit=(concurrency or workload.num_prompts) + 8, limit_per_host=0)
    session = aiohttp.ClientSession(
        connector=connector,
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=None),
        read_bufsize=10 * 1024**2,  # long SSE lines under load (sglang does the same)
    )
    try:
        info = await _probe_server(session, base_url)
        model_name = model or info.model
        specs = build_requests(workload, counter)
        url = f"{base_url}/v1/chat/completions" if workload.api == "chat" else f"{base_url}/v1/completions"
        req_timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=min(30.0, request_timeout_s))
        if engine_config is not None and engine_config.speculative:
            n_draft: int | None = engine_config.num_draft_tokens
        else:
            n_draft = num_draft_tokens

        if workload.warmup_requests:
            await _warm_up(session, url, workload, model_name, specs, counter, req_timeout)
        occupancy = None
        # The probe only matters where the rule can stop: with at most two turnovers of prompts the
        # queue is empty by the time the first turnover is done, so there is no steady state.
        if steady_state is not None and concurrency and len(specs) > 2 * concurrency:
            occupancy = await _probe_occupancy(session, url, workload, model_name, specs, counter, req_timeout,
                                               info.sim_clock, concurrency)

        before = await _scrape_spec_counters(session, base_url)
        started_iso = utc_now_iso()
        sink.on_start(len(specs))
        t0 = time.monotonic()
        tracker = _SteadyStateTracker(steady_state, info.time_scale, t0) if steady_state is not None else None
        outputs, t_end, early = await _dispatch_all(
            session, url, workload, model_name, specs, counter, req_timeout, sink, tracker, concurrency,
            info.sim_clock, occupancy,
        )
        if info.sim_clock is not None:
            # On the simulator's timeline: the run began when its first request arrived there and
            # ended when it produced its last token (not when that was delivered).
            t0 = min([o.started_at for o in outputs if o.ttft is not None], default=t0)
            stamps = [o.last_token_at for o in outputs if o.last_token_at is not None]
            t_end = max(stamps, default=t_end)
        after = await _scrape_spec_counters(session, base_url, min(PROBE_TIMEOUT_S, request_timeout_s))
        finished_iso = utc_now_iso()
    finally:
        await session.close()

    delta: dict[str, float] = {}
    if before is not None and after is not None:
        delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in SPEC_COUNTER_NAMES if k in after}
    estimate: SteadyStateEstimate | None = None
    if tracker is not None:
        estimate = tracker.stopped_with if early and tracker.stopped_with is not None else tracker.estimate(t_end)
    result = _summarize(
        outputs=outputs,
        workload=workload,
        duration_wall_s=t_end - t0,
        info=info,
        engine_config=engine_config,
        spec_delta=delta,
        n_draft=n_draft,
        early=early,
        estimate=estimate,
        started_iso=started_iso,
        finished_iso=finished_iso,
    )
    sink.on_complete(result)
    return result


async def _warm_up(
    session: aiohttp.ClientSession,
    url: str,
    w: Workload,
    model: str,
    specs: list[RequestSpec],
    counter: TokenCounter,
    timeout: aiohttp.ClientTimeout,
) -> None:
    sem = asyncio.Semaphore(w.max_concurrency or w.warmup_requests)

    async def one(i: int) -> RequestOutput:
        spec = specs[i % len(specs)]
        async with sem:
            return await _send(
                session, url, w, model, _RequestState(-1 - i, spec), counter, _Hooks(), timeout,
                min(spec.output_len, WARMUP_MAX_OUTPUT_TOKENS),
            )

    results = await asyncio.gather(*(one(i) for i in range(w.warmup_requests)))
    bad = [r for r in results if not r.success]
    if bad:
        logger.warning("%d of %d warm-up requests failed (first: %s %s)", len(bad), len(results), bad[0].error_kind, bad[0].error[:200])


async def _dispatch_all(
    session: aiohttp.ClientSession,
    url: str,
    w: Workload,
    model: str,
    specs: list[RequestSpec],
    counter: TokenCounter,
    timeout: aiohttp.ClientTimeout,
    sink: SafeProgress,
    tracker: _SteadyStateTracker | None,
    concurrency: int | None,
    clock: SimClock | None = None,
    occupancy: tuple[list[float], list[float], list[float]] | None = None,
) -> tuple[list[RequestOutput], float, bool]:
    """Send every request (Poisson arrivals or all at once, at most ``concurrency`` in flight);
    return the outputs in request order, the end time, and whether the steady-state rule stopped it."""
    total = len(specs)
    hooks = _RunHooks(total, concurrency, tracker)
    if tracker is not None:
        hooks.stats = _StreamStats(None, tracker.window_wall_s / 2,
                                   max(s.output_len for s in specs) / 32 if specs else 1.0)
    sem = asyncio.Semaphore(concurrency) if concurrency is not None else None
    states = [_RequestState(i, s) for i, s in enumerate(specs)]
    outputs: list[RequestOutput | None] = [None] * total
    all_done = asyncio.Event()
    stop = asyncio.Event()
    finished = 0

    async def one(state: _RequestState) -> None:
        async def go() -> None:
            nonlocal finished
            hooks.on_slot(state)
            # Closed loop on the simulator: this request's slot is taken by a new one when it finishes.
            hold = clock is not None and sem is not None and math.isinf(w.request_rate) and state.index < total - (concurrency or 0)
            out = await _send(session, url, w, model, state, counter, hooks, timeout, state.spec.output_len, clock, hold)
            state.done = True
            outputs[state.index] = out
            # On the token clock (the simulator's stamps, SimClock), like the tokens the windows count:
            # wall time runs ahead of the stamps whenever the simulator falls behind or holds its clock.
            hooks.on_finish(state, state.last_at if state.last_at is not None else time.monotonic())
            finished += 1
            sink.on_request_done(out)
            if finished == total:
                all_done.set()

        if sem is None:
            await go()
        else:
            async with sem:
                await go()

    tasks: list[asyncio.Task[None]] = []
    arrival_rng = np.random.RandomState(w.seed)

    async def dispatch() -> None:
        for st in states:
            tasks.append(asyncio.create_task(one(st)))
            if not math.isinf(w.request_rate):
                await asyncio.sleep(float(arrival_rng.exponential(1.0 / w.request_rate)))

    async def monitor() -> None:
        assert tracker is not None
        while True:
            await asyncio.sleep(tracker.window_wall_s)
            # Stamped tokens are delivered up to a few ms after their time, on the simulator's clock
            # (which stands still during closed-loop holds): judge only windows that closed at
            # least DELIVERY_LAG_S before the newest stamp seen.
            now = (hooks.latest - DELIVERY_LAG_S) if clock is not None else time.monotonic()
            est = tracker.converged(now)
            if est is not None:
                est = _with_full_run_bounds(est, states, now, tracker, concurrency, hooks.stats, occupancy)
                if est is not None:
                    tracker.stopped_with = est  # the estimate the decision was made on is the one reported
                    stop.set()
                    return
            if tracker.end_at is not None:
                return  # saturation is over without convergence: the run completes in full

    dispatcher = asyncio.create_task(dispatch())
    watchers = [asyncio.create_task(all_done.wait()), asyncio.create_task(stop.wait())]
    mon = asyncio.create_task(monitor()) if tracker is not None else None
    try:
        await asyncio.wait(watchers, return_when=asyncio.FIRST_COMPLETED)
    finally:
        early = stop.is_set() and not all_done.is_set()
        t_end = time.monotonic()
        for t in [dispatcher, *watchers, *([mon] if mon else []), *tasks]:
            if not t.done():
                t.cancel()
        await asyncio.gather(dispatcher, *watchers, *([mon] if mon else []), *tasks, return_exceptions=True)

    final: list[RequestOutput] = []
    for st, out in zip(states, outputs):
        if out is None:  # cancelled by the early stop (or never dispatched)
            out = st.freeze(success=False, kind="cancelled", error="stopped early: steady state reached", counter=counter, now=t_end)
        final.append(out)
    return final, t_end, early


def _with_full_run_bounds(
    est: SteadyStateEstimate,
    states: Sequence[_RequestState],
    now: float,
    tracker: _SteadyStateTracker,
    concurrency: int | None,
    stats: _StreamStats | None = None,
    occupancy: tuple[list[float], list[float], list[float]] | None = None,
) -> SteadyStateEstimate | None:
    """``est`` with the full-run bounds, or ``None`` while the drain's share is still too uncertain."""
    started = [st for st in states if st.ttft is not None and st.started_at is not None]
    if not concurrency or not started:
        return None
    scale = tracker.time_scale
    model = None
    if stats is not None and occupancy is not None:
        model = fit_step_model(stats.windows(now, concurrency), occupancy, stats.positions(), concurrency)
    flight = [st for st in states if st.started_at is not None and not st.done]
    queued = [st for st in states if st.started_at is None]
    low, high = full_run_throughput_bounds(
        now=now,
        t0=min(st.started_at for st in started),  # type: ignore[type-var]
        in_flight_remaining=[max(0.0, st.spec.output_len - st.tokens) for st in flight],
        queued_lengths=[float(st.spec.output_len) for st in queued],
        total_tokens=float(sum(st.spec.output_len for st in states)),
        concurrency=concurrency,
        steady_throughput=est.throughput * scale,  # tokens per local second
        startup_s=float(statistics.median(st.ttft for st in started)),  # type: ignore[type-var]
        step_model=model,
        in_flight_positions=[st.tokens for st in flight],
        in_flight_prompts=[float(st.spec.prompt_len) for st in flight],
        queued_prompts=[float(st.spec.prompt_len) for st in queued],
        z=statistics.NormalDist().inv_cdf(0.5 + tracker.rule.confidence / 2),
    )
    low, high = low / scale, high / scale  # tokens per server second
    if high <= 0 or (high - low) / (high + low) > tracker.rule.drain_tolerance:
        return None
    return dataclasses.replace(est, full_run_low=low, full_run_high=high,
                               drain_model=model.to_dict() if model is not None else None)


def _summarize(
    *,
    outputs: list[RequestOutput],
    workload: Workload,
    duration_wall_s: float,
    info: ServerInfo,
    engine_config: EngineConfig | None,
    spec_delta: dict[str, float],
    n_draft: int | None,
    early: bool,
    estimate: SteadyStateEstimate | None,
    started_iso: str,
    finished_iso: str,
) -> BenchResult:
    scale = info.time_scale
    duration = max(duration_wall_s * scale, 1e-9)
    completed = [o for o in outputs if o.success]
    failed = [o for o in outputs if not o.success and not o.cancelled]
    # Cancelled requests that started streaming contribute their received part to per-token figures.
    partial = [o for o in outputs if o.cancelled and o.ttft is not None]
    reasons: dict[str, int] = {}
    for o in failed:
        reasons[o.error_kind or "unknown"] = reasons.get(o.error_kind or "unknown", 0) + 1

    total_in = sum(o.prompt_len for o in completed)
    total_out = sum(o.output_len for o in completed)
    ttfts = [o.ttft for o in completed + partial if o.ttft is not None]
    tpots = [(o.latency - o.ttft) / (o.output_len - 1) for o in completed if o.output_len > 1 and o.ttft is not None]
    for o in partial:
        if o.last_token_at is not None and o.output_len > 1:
            tpots.append((o.last_token_at - o.started_at - o.ttft) / (o.output_len - 1))  # type: ignore[operator]
    itls = [g for o in completed + partial for g in o.itl]
    e2es = [o.latency for o in completed]

    output_throughput = total_out / duration
    if early and estimate is not None and estimate.full_run_low is not None and estimate.full_run_high is not None:
        output_throughput = (estimate.full_run_low + estimate.full_run_high) / 2
    input_throughput = total_in / duration
    return BenchResult(
        workload=workload.to_dict(),
        engine_key=engine_config.key() if engine_config is not None else None,
        engine_config=engine_config.to_dict() if engine_config is not None else None,
        versions=_versions(info),
        started_at=started_iso,
        finished_at=finished_iso,
        duration_s=duration,
        completed=len(completed),
        failed=len(failed),
        failure_reasons=reasons,
        request_throughput=len(completed) / duration,
        input_throughput=input_throughput,
        output_throughput=output_throughput,
        total_token_throughput=input_throughput + output_throughput,
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        ttft_ms=compute_latency_stats(ttfts, scale),
        tpot_ms=compute_latency_stats(tpots, scale),
        itl_ms=compute_latency_stats(itls, scale),
        e2e_ms=compute_latency_stats(e2es, scale),
        accept_length=accept_length_from_counters(spec_delta, n_draft),
        spec_counters=spec_delta,
        simulated=info.simulated,
        time_scale=scale,
        early_stopped=early,
        concurrency=workload.max_concurrency,
        cancelled=sum(1 for o in outputs if o.cancelled),
        steady_state=estimate.to_dict() if estimate is not None else None,
    )


def benchmark(base_url: str, workload: Workload, **kwargs: Any) -> BenchResult:
    """Synchronous :func:`run_benchmark` (``asyncio.run``); same arguments."""
    return asyncio.run(run_benchmark(base_url, workload, **kwargs))


# ----- CLI ----------------------------------------------------------------------------------------

SIM_PROFILE = "intern-s2-preview-8xh200"


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tuning.bench",
        description=(
            "Benchmark an OpenAI-compatible LLM server like sglang.bench_serving (TTFT, ITL, TPOT, E2E, "
            "throughput, MTP accept length). Without --base-url, starts the simulated engine and benchmarks it."
        ),
    )
    a = p.add_argument
    a("--base-url", help="server to benchmark, e.g. http://127.0.0.1:23333; omit to start a simulated engine (--sim)")
    a("--sim", action="store_true", help="start a simulated engine (profile %s, tp 8, MTP with 3 draft tokens) and benchmark it; the default without --base-url" % SIM_PROFILE)
    a("--sim-time-scale", type=float, default=20.0, help="simulated engine speed-up over real time (figures are reported in simulated time; default 20)")
    a("--sim-no-mtp", action="store_true", help="start the simulated engine without speculative decoding (baseline)")
    a("--sim-log-dir", default=None, help="folder for the simulated engine's log (default: a temporary folder)")
    a("--backend-api", choices=["completions", "chat"], default="completions", help="endpoint: /v1/completions or /v1/chat/completions (default completions)")
    a("--model", default=None, help="model name sent in requests (default: the first model GET /v1/models lists)")
    a("--dataset", choices=["random", "sharegpt"], default="random", help="prompt source (default random: real text cut to drawn lengths)")
    a("--dataset-path", default=None, help="ShareGPT JSON file (for --dataset sharegpt)")
    a("--sharegpt-output-len", choices=["fixed", "dataset"], default="fixed", help="ShareGPT output length: --random-output-len for every request (fixed) or the gpt turn's length (dataset)")
    a("--random-input-len", type=int, default=1024, help="max input tokens per request (random); max prompt length kept (sharegpt) (default 1024)")
    a("--random-output-len", type=int, default=1024, help="max output tokens per request (default 1024)")
    a("--random-range-ratio", type=float, default=0.5, help="lengths are drawn uniformly in [ratio*len, len] (default 0.5)")
    a("--num-prompts", type=int, default=256, help="requests measured (default 256)")
    a("--max-concurrency", type=int, default=64, help="requests in flight at most; 0 = unbounded (default 64)")
    a("--request-rate", type=float, default=math.inf, help="Poisson arrival rate in requests/s; inf = all at once (default inf)")
    a("--warmup-requests", type=int, default=1, help="requests sent before measuring, not counted (default 1)")
    a("--temperature", type=float, default=0.0, help="sampling temperature (default 0)")
    a("--ignore-eos", action=argparse.BooleanOptionalAction, default=True, help="generate exactly the requested output length (default on)")
    a("--seed", type=int, default=0, help="seed of the dataset draw, prompt text and arrivals (default 0)")
    a("--tokenizer", default=None, help="model dir or tokenizer.json to count tokens with (default: the simulator's word tokenizer)")
    a("--num-draft-tokens", type=int, default=None, help="draft tokens per step N for the accept length (default: from the engine's counters)")
    a("--steady-state-tolerance", type=float, default=None, help="stop early once steady-state output throughput is known within this relative 95%% CI half-width (e.g. 0.02); off by default")
    a("--steady-state-window", type=float, default=5.0, help="steady-state window length in server seconds (default 5)")
    a("--request-timeout", type=float, default=3600.0, help="per-request wall-clock timeout in seconds (default 3600)")
    a("--name", default="", help="workload (bucket) name recorded in the result")
    a("--output", default=None, help="write the BenchResult JSON to this file")
    a("--api-key", default=None, help="sent as Authorization: Bearer KEY")
    a("--quiet", action="store_true", help="no progress bar or summary table (the JSON still goes to --output)")
    return p


def _summary_table(result: BenchResult) -> Any:
    from rich.table import Table

    title = "Benchmark result"
    if result.simulated:
        title += f" — SIMULATED ENGINE (time scale {result.time_scale:g}; figures in simulated time)"
    t = Table(title=title, show_header=True)
    t.add_column("metric")
    t.add_column("value", justify="right")
    w = result.workload
    rows: list[tuple[str, str]] = [
        ("workload", f"{w['dataset']} in≤{w['input_len']} out≤{w['output_len']} ratio {w['range_ratio']} x{w['num_prompts']} conc {w['max_concurrency']}"),
        ("completed / failed / cancelled", f"{result.completed} / {result.failed} / {result.cancelled}"),
    ]
    if result.failure_reasons:
        rows.append(("failure reasons", ", ".join(f"{k}: {v}" for k, v in result.failure_reasons.items())))
    rows += [
        ("duration (s)", f"{result.duration_s:.2f}"),
        ("request throughput (req/s)", f"{result.request_throughput:.2f}"),
        ("input throughput (tok/s)", f"{result.input_throughput:.1f}"),
        ("output throughput (tok/s)" + (" [steady state]" if result.early_stopped else ""), f"{result.output_throughput:.1f}"),
        ("total token throughput (tok/s)", f"{result.total_token_throughput:.1f}"),
        ("total input / output tokens", f"{result.total_input_tokens} / {result.total_output_tokens}"),
    ]
    for label, s in (("TTFT", result.ttft_ms), ("TPOT", result.tpot_ms), ("ITL", result.itl_ms), ("E2E", result.e2e_ms)):
        rows.append((f"{label} mean / median / p99 (ms)", f"{s.mean:.2f} / {s.median:.2f} / {s.p99:.2f}"))
    rows.append(("accept length", "n/a" if result.accept_length is None else f"{result.accept_length:.3f}"))
    if result.steady_state:
        ss = result.steady_state
        rows.append(("steady-state throughput (tok/s)", f"{ss['throughput']:.1f} ± {ss['half_width']:.1f} ({ss['windows']} windows)"))
    rows.append(("engine", f"{result.versions.get('engine')} {result.engine_key or ''}".strip()))
    for k, v in rows:
        t.add_row(k, v)
    return t


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code (2 when the server cannot be reached or inputs are invalid)."""
    args = _build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from rich.console import Console

    console = Console(stderr=True)
    try:
        workload = Workload(
            dataset=args.dataset,
            input_len=args.random_input_len,
            output_len=args.random_output_len,
            range_ratio=args.random_range_ratio,
            num_prompts=args.num_prompts,
            max_concurrency=args.max_concurrency or None,
            request_rate=args.request_rate,
            temperature=args.temperature,
            seed=args.seed,
            api=args.backend_api,
            ignore_eos=args.ignore_eos,
            warmup_requests=args.warmup_requests,
            sharegpt_path=args.dataset_path,
            sharegpt_output_len=args.sharegpt_output_len,
            name=args.name,
        )
        rule = (
            SteadyStateRule(rel_tolerance=args.steady_state_tolerance, window_s=args.steady_state_window)
            if args.steady_state_tolerance is not None
            else None
        )
        tokenizer = resolve_token_counter(args.tokenizer)
    except OrchestratorError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    progress = None if args.quiet else RichProgress(description=workload.name or "benchmark", console=console)
    kwargs: dict[str, Any] = dict(
        model=args.model,
        tokenizer=tokenizer,
        steady_state=rule,
        progress=progress,
        request_timeout_s=args.request_timeout,
        api_key=args.api_key,
        num_draft_tokens=args.num_draft_tokens,
    )
    engine = None
    try:
        if args.base_url and not args.sim:
            base_url = args.base_url
        else:
            engine, engine_config = _start_sim_engine(args, console)
            base_url = engine.base_url
            kwargs["engine_config"] = engine_config
        result = benchmark(base_url, workload, **kwargs)
    except ServerUnreachableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OrchestratorError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if engine is not None:
            engine.stop()

    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(result.to_json() + "\n", encoding="utf-8")
    if not args.quiet:
        try:
            Console().print(_summary_table(result))
        except Exception:  # noqa: BLE001 - the display never fails the run
            logger.exception("could not render the summary table")
    if not args.output:
        print(result.to_json())
    return 0


def _start_sim_engine(args: argparse.Namespace, console: Any) -> tuple[Any, EngineConfig]:
    """Start the simulated engine for ``--sim`` (lazy imports: the engine package is optional here)."""
    import tempfile

    from orchestrator.config import EngineConfig
    from orchestrator.engine import EngineProcess

    spec = {} if args.sim_no_mtp else {"speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": 3}
    config = EngineConfig(backend="sim", model=SIM_PROFILE, tp=8, **spec)
    log_dir = args.sim_log_dir or tempfile.mkdtemp(prefix="bench-sim-")
    engine = EngineProcess(config, sim_time_scale=args.sim_time_scale, log_dir=log_dir)
    if not args.quiet:
        console.print(f"starting the simulated engine ({config.label()}, time scale {args.sim_time_scale:g}); log in {log_dir}")
    engine.start()
    try:
        engine.wait_until_ready()
    except BaseException:
        engine.stop()
        raise
    return engine, config


if __name__ == "__main__":
    # Re-import as ``tuning.bench`` so classes are shared with modules that import it.
    from tuning.bench import main as _main

    sys.exit(_main())
