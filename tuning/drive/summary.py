"""The drive's report as text: goodput and throughput per phase, errors, the SLO, whether simulated
engines kept their schedule, and the SIMULATED label. Pure: a :class:`DriveResult` in, lines out."""
from __future__ import annotations

from tuning.drive.records import DriveResult, EngineLateness
from tuning.drive.report import PhaseFigures, Slo, overall_figures, phase_figures
from tuning.traffic import LoadProfile

__all__ = ["MAX_LAG_SHARE", "kept_schedule", "max_lag_s", "report_lines"]

MAX_LAG_SHARE = 0.01
"""A simulated engine kept its schedule when its loop ran, averaged over its steps, at most this share
of the profile's shortest phase behind. Why this bound: the driver times each request by the engine's
own stamps (exact at any lag) and places it on the profile's clock at its send time, so a lag L only
shifts when requests start; tokens then move by at most L between phases, under 1 % of the shortest
phase's. An engine further behind has run a different load profile, and its figures rank nothing."""


def max_lag_s(profile: LoadProfile) -> float:
    """The largest mean lag (simulated seconds) an engine may have on ``profile``."""
    return MAX_LAG_SHARE * min(p.seconds for p in profile.phases)


def kept_schedule(lateness: tuple[EngineLateness, ...], profile: LoadProfile) -> bool:
    """Every engine kept its schedule (``False`` when no engine reported counters)."""
    return bool(lateness) and all(e.mean_lag_s <= max_lag_s(profile) for e in lateness)


def _row(f: PhaseFigures) -> str:
    good = "-" if f.good_share is None else f"{f.good_share:.0%}"
    errors = ", ".join(f"{k} {v}" for k, v in sorted(f.errors.items())) or "-"
    ttft = "-" if f.ttft_median_s is None else f"{f.ttft_median_s:.2f}"
    tpot = "-" if f.tpot_median_s is None else f"{f.tpot_median_s * 1000:.1f}"
    return (f"{f.label:<22} {f.start:>7.0f}-{f.end:<7.0f} {f.goodput:>10,.0f} {f.throughput:>10,.0f} {f.started:>7} "
            f"{f.completed:>6} {good:>5} {ttft:>7} {tpot:>7}  {errors}")


def report_lines(result: DriveResult, slo: Slo) -> list[str]:
    profile = LoadProfile.model_validate(result.profile)
    label = "SIMULATED " if result.simulated else ""
    unit = "simulated s" if result.simulated else "s"
    lines = [f"{label}mixed-workload drive of {result.base_url} (model {result.model}"
             + (f", time scale {result.time_scale:g}" if result.simulated else "") + ")",
             f"good request: completed and {slo.describe()}; goodput = good requests' output tokens per {unit} "
             "inside the phase",
             f"{'phase':<22} {'window':^15} {'goodput':>10} {'tput':>10} {'started':>7} {'done':>6} {'good':>5} "
             f"{'TTFT50':>7} {'TPOT50':>7}  errors"]
    for f in phase_figures(result.records, profile, slo):
        lines.append(_row(f))
    lines.append(_row(overall_figures(result.records, profile, slo)))
    cancelled = sum(1 for r in result.records if r.error_kind == "cancelled")
    if cancelled:
        lines.append(f"{cancelled} request(s) still running {result.drain_s:g} {unit} after the profile's end were "
                     "cancelled (counted in no phase)")
    if result.simulated:
        if not result.lateness:
            lines.append("engine schedule: unknown (/sim/info gave no counters); do not rank these figures")
        for e in result.lateness:
            lines.append(f"engine {e.engine}: {e.late_steps} of {e.steps} steps late, mean lag "
                         f"{e.mean_lag_s * 1000:.2f} ms simulated")
        lines.append("engines kept their schedule" if kept_schedule(result.lateness, profile) else
                     f"ENGINES FELL BEHIND (mean lag > {max_lag_s(profile) * 1000:g} ms, 1 % of the shortest phase): "
                     "these figures rank nothing; lower the time scale or free CPUs")
        lines.append("SIMULATED: figures come from the simulator's performance model, not from a GPU")
    return lines
