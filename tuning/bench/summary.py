"""From the requests' outcomes to a :class:`BenchResult`: the figures as ``sglang.bench_serving``
defines them (see :mod:`tuning.bench`), scaled to simulated time for the simulator. Pure."""
from __future__ import annotations

import platform
from typing import TYPE_CHECKING

from tuning.bench.counters import accept_length_from_counters, tokens_per_step_from_counters
from tuning.bench.records import BenchResult, RequestOutput, ServerInfo, compute_latency_stats
from tuning.bench.steady import SteadyStateEstimate
from tuning.workload import Workload

if TYPE_CHECKING:
    from orchestrator.config import EngineConfig

__all__: list[str] = []


def _versions(info: ServerInfo) -> dict[str, str]:
    from orchestrator.hostinfo import package_version

    ours = package_version("mtp-autotune") or "0.1.0+checkout"  # not installed: running from a checkout
    out = {"mtp_autotune": ours, "python": platform.python_version(), "engine": info.engine}
    if info.sim_info is not None:
        out["sim_profile"] = str(info.sim_info.get("profile", "unknown"))
    return out


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
    accept_length = accept_length_from_counters(spec_delta, n_draft)
    cancelled = sum(1 for o in outputs if o.cancelled)
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
        accept_length=accept_length,
        spec_counters=spec_delta,
        simulated=info.simulated,
        time_scale=scale,
        early_stopped=early,
        concurrency=workload.max_concurrency,
        cancelled=cancelled,
        steady_state=estimate.to_dict() if estimate is not None else None,
        # Cancelled requests delivered outputs too (outputs_per_request)
        tokens_per_step_estimate=tokens_per_step_from_counters(accept_length, spec_delta,
                                                               len(completed) + cancelled, n_draft),
    )
