"""The routing table's provenance: what was measured, on what, with which software and workload."""
from __future__ import annotations

from typing import Any

from orchestrator.backends import get_backend
from orchestrator.fsutil import utc_now_iso
from orchestrator.hostinfo import detect_gpus, package_versions
from orchestrator.table import Provenance
from tuning.sweep.spec import SweepSpec

__all__ = ["provenance_for", "versions"]


def versions(spec: SweepSpec) -> dict[str, str]:
    """The versions that decide the figures: the engines' (each engine family of the space, or the
    simulator's profile), and the sweep's own stack."""
    engines = () if spec.simulated else tuple(p for e in spec.space.engines if (p := get_backend(e).package))
    out = package_versions((*dict.fromkeys(engines), "ray", "optuna", "mtp-autotune"))
    if spec.simulated:
        out["engine"] = f"simulator (profile {spec.space.model})"
    return out


def _measured_engine_versions(results: Any) -> dict[str, str]:
    """``{package: version}`` the trials recorded, per engine measured (its most common version)."""
    if results is None or "engine_version" not in results.columns or "engine" not in results.columns:
        return {}
    out: dict[str, str] = {}
    for engine, rows in results.groupby("engine"):
        package = get_backend(str(engine)).package
        if package and (version := _most_common(rows, "engine_version")):
            out[package] = version
    return out


def _most_common(results: Any, column: str) -> str | None:
    if results is None or column not in results.columns:
        return None
    values = results.loc[results["status"] == "ok", column].dropna().astype(str)
    return values.mode().iloc[0] if len(values) else None


def provenance_for(spec: SweepSpec, results: Any = None) -> Provenance:
    """The table's provenance. The GPU and the LMDeploy version come from the rows the trials
    measured (each trial records its own node's: the driver may run on a machine without GPUs or
    LMDeploy, e.g. ``--address ray://...``); this process's are the fallback."""
    engine_versions = versions(spec)
    if spec.simulated:
        gpu_type, gpu_count = "none (simulated)", 0
    else:
        measured_on = _most_common(results, "gpu_type")
        gpu_type, count = (measured_on, 1) if measured_on else detect_gpus()
        gpu_count = spec.space.tp if count else 0
        if lmdeploy := _most_common(results, "lmdeploy_version"):  # rows from before engine_version
            engine_versions["lmdeploy"] = lmdeploy
        engine_versions.update(_measured_engine_versions(results))
    return Provenance(
        model=spec.space.model, gpu_type=gpu_type, gpu_count=gpu_count, engine_versions=engine_versions,
        sweep_id=spec.sweep_id, created_at=utc_now_iso(), simulated=spec.simulated,
        workload={"buckets": {b.name: {"workload": b.workload.to_dict(),
                                       "concurrency_levels": list(b.concurrency_levels)} for b in spec.buckets},
                  "steady_state": dict(spec.steady_state) if spec.steady_state else None,
                  "steady_state_min_output_len": spec.steady_state_min_output_len,
                  "sim_time_scale": spec.sim_time_scale},
        objective=f"output_throughput (search: {spec.objective})", constraints=spec.constraints.to_dict(),
    )
