"""Facts about this host and its software, as recorded beside measured figures (one copy of each probe).

A figure means little without where it was taken: which GPU and how many, which LMDeploy, and — a
small model's engine being CPU-bound — which host CPU and how many cores the process may use. The
sweep's trials record these on the node that measured; the routing table's provenance and the GPU
scripts read them from here too.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from importlib import metadata

__all__ = [
    "busy_share",
    "cpu_model",
    "cpu_times",
    "cpu_times_from_stat",
    "cpus_available",
    "detect_gpus",
    "measured_on",
    "package_version",
    "package_versions",
]


def package_version(name: str) -> str | None:
    """The installed version of distribution ``name``, or ``None`` when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def package_versions(names: Iterable[str]) -> dict[str, str]:
    """``{name: version}`` for the installed ones of ``names`` (absent ones are left out)."""
    return {n: v for n in names if (v := package_version(n)) is not None}


def git_commit(cwd: str | os.PathLike[str]) -> str | None:
    """The commit checked out at ``cwd`` (what a result was computed with), or ``None`` outside git."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def cpu_model() -> str | None:
    """The host CPU's model name (``/proc/cpuinfo``), or ``None`` where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        return None


def cpus_available() -> int:
    """The CPUs this process may run on (its affinity mask: a ``taskset`` pinning shows here)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def cpu_times_from_stat(line: str) -> tuple[int, int] | None:
    """``(busy, total)`` clock ticks from the first (``cpu``) line of ``/proc/stat``; ``None`` for any
    other line. Busy is everything but idle and I/O wait — steal time counts as busy (the CPU was not
    this host's to use); guest time is inside user time, so it is not added again."""
    fields = line.split()
    if len(fields) < 6 or fields[0] != "cpu":
        return None
    try:
        ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait [irq softirq steal]
    except ValueError:
        return None
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def cpu_times() -> tuple[int, int] | None:
    """``(busy, total)`` clock ticks of all the host's CPUs since boot (:func:`cpu_times_from_stat` of
    ``/proc/stat``), or ``None`` where they cannot be read (not Linux). In a container limited to some
    CPUs the share is of the whole host's."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            return cpu_times_from_stat(f.readline())
    except OSError:
        return None


def busy_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of the host's CPU time that was busy between two :func:`cpu_times` snapshots (0-1), or
    ``None`` without both or when no time passed. A small model's engine is launch-bound, so a figure
    taken while other work keeps every CPU busy is slower than the same engine's on a quiet host: the
    share is recorded beside each figure so that such a figure can be told apart."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return round(min(1.0, max(0.0, (after[0] - before[0]) / (after[1] - before[1]))), 4)


def detect_gpus() -> tuple[str, int]:
    """(GPU type, count) of this node: nvidia-smi, else torch, else ``("none", 0)``."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=20, check=True).stdout.strip().splitlines()
            if out:
                return out[0].strip(), len(out)
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        import torch  # type: ignore[import-not-found]

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0), torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - torch absent or broken: no GPU info
        pass
    return "none", 0


def measured_on(engine: str | None = None) -> dict[str, str | int | None]:
    """What a real engine is measured on, from the node that measures it: GPU type, the engine's
    version, host CPU model and the CPUs this process may use. The CPU facts are there because a small
    model's engine is CPU-bound: the same configs measured 1.5x apart on two H200 hosts, and the
    host CPU and core count are the first thing to compare.

    Args:
        engine: the engine backend measured (:mod:`orchestrator.backends`): its version is
            ``engine_version``. ``None``: ``lmdeploy_version``, for the LMDeploy-only GPU scripts.
    """
    from orchestrator.backends import get_backend

    gpu_type, count = detect_gpus()
    version = {"engine_version": get_backend(engine).version()} if engine is not None else \
        {"lmdeploy_version": package_version("lmdeploy")}
    return {"gpu_type": gpu_type if count else None, **version, "cpu_model": cpu_model(), "cpus": cpus_available()}
