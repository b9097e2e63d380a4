"""Processes of a multi-node Ray cluster run on one host (``ray.cluster_utils.Cluster``), found
through ``/proc``: which node label each Serve replica or simulated engine inherited from its raylet.

Why through ``/proc``: on one host every "node" is a raylet with its own environment, and a process
inherits its node's label (an environment variable the test or benchmark sets per node); Ray's own
APIs name node ids, not the label the caller chose. Shared by ``tests/integration/test_multinode.py``
and ``benchmarks/node_loss_serve.py``.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = ["LiveProcess", "live_processes", "replicas_by_node", "running_replicas"]


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


@dataclass(frozen=True)
class LiveProcess:
    """A running (not zombie) process: its pid and command line."""

    pid: int
    argv: tuple[str, ...]

    def env(self) -> dict[str, str]:
        raw = _read(f"/proc/{self.pid}/environ").decode(errors="replace").split("\0")
        return dict(kv.split("=", 1) for kv in raw if "=" in kv)

    def stdout(self) -> str | None:
        """Where its stdout goes (a file path, a pipe, ...), ``None`` when it cannot be read."""
        try:
            return os.readlink(f"/proc/{self.pid}/fd/1")
        except OSError:
            return None


def live_processes() -> Iterator[LiveProcess]:
    """Every live process of the host (zombies and dead ones skipped)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        argv = tuple(_read(f"/proc/{entry}/cmdline").decode(errors="replace").split("\0"))
        stat = _read(f"/proc/{entry}/stat").decode(errors="replace")
        if not stat or stat[stat.rfind(")") + 2:].split()[0] in ("Z", "X"):
            continue
        yield LiveProcess(int(entry), argv)


def replicas_by_node(app: str, deployments: Iterable[str], node_env: str) -> dict[str, list[str]]:
    """Deployment -> node labels (``node_env`` of each process) of ``app``'s live Serve replica
    processes (Ray titles them ``ray::ServeReplica:<app>:<deployment>``)."""
    names = tuple(deployments)
    out: dict[str, list[str]] = {}
    prefix = f"ray::ServeReplica:{app}:"
    for proc in live_processes():
        title = proc.argv[0]
        if not title.startswith(prefix):
            continue
        # While a replica runs a call, Ray appends the method: ``...:<deployment>.<method>``.
        name = title[len(prefix):].split()[0]
        name = next((n for n in names if name == n or name.startswith(n + ".")), name)
        out.setdefault(name, []).append(proc.env().get(node_env, "?"))
    return {k: sorted(v) for k, v in out.items()}


def running_replicas(app: str) -> dict[str, int]:
    """Deployment -> replicas Serve reports RUNNING for ``app`` (empty when the app is not there)."""
    from ray import serve

    status = serve.status().applications.get(app)
    if status is None:
        return {}
    return {name: int(sum(c for s, c in d.replica_states.items() if getattr(s, "value", s) == "RUNNING"))
            for name, d in status.deployments.items()}
