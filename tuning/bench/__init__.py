"""The benchmark client: drive an OpenAI-compatible server with a :class:`Workload`, return a
:class:`BenchResult`. ``python -m tuning.bench --help`` is the CLI.

Modules: :mod:`.records` (typed results), :mod:`.client` (HTTP and SSE parsing), :mod:`.runner`
(one run), :mod:`.summary` (figures from outcomes), :mod:`.steady` and :mod:`.drain` (the
steady-state early stop), :mod:`.counters` (accept length), :mod:`.progress` / :mod:`.display`
(callbacks and the rich display), :mod:`.cli`.

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

Steady-state early stop: see :mod:`tuning.bench.steady` and :mod:`tuning.bench.drain`.
"""
from __future__ import annotations

from tuning.bench.cli import main
from tuning.bench.counters import SPEC_COUNTER_NAMES, accept_length_from_counters, parse_spec_counters
from tuning.bench.display import RichProgress
from tuning.bench.drain import (
    StepTimeModel,
    fit_occupancy_curve,
    fit_step_model,
    full_run_throughput_bounds,
    occupancy_probe_lengths,
    predict_drain_end,
    predict_full_run_end,
)
from tuning.bench.errors import BenchError, ServerUnreachableError
from tuning.bench.progress import BenchProgress, NullProgress, SafeProgress
from tuning.bench.records import BenchResult, LatencyStats, RequestOutput, ServerInfo, SimClock, compute_latency_stats
from tuning.bench.runner import benchmark, run_benchmark
from tuning.bench.steady import SteadyStateEstimate, SteadyStateRule

__all__ = [
    "SPEC_COUNTER_NAMES",
    "BenchError",
    "BenchProgress",
    "BenchResult",
    "LatencyStats",
    "NullProgress",
    "RequestOutput",
    "RichProgress",
    "SafeProgress",
    "ServerInfo",
    "ServerUnreachableError",
    "SimClock",
    "SteadyStateEstimate",
    "SteadyStateRule",
    "StepTimeModel",
    "accept_length_from_counters",
    "benchmark",
    "compute_latency_stats",
    "fit_occupancy_curve",
    "fit_step_model",
    "full_run_throughput_bounds",
    "main",
    "occupancy_probe_lengths",
    "parse_spec_counters",
    "predict_drain_end",
    "predict_full_run_end",
    "run_benchmark",
]
