"""Shared test set-up: the ``gpu`` marker, pytest-xdist groups and a per-test log folder."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest


def _gpu_skip_reason() -> str | None:
    """Why GPU tests cannot run here, or ``None`` when they can (CUDA GPU, torch and LMDeploy)."""
    for module in ("torch", "lmdeploy"):
        if importlib.util.find_spec(module) is None:
            return f"needs {module} (GPU node with the [gpu] extra)"
    import torch

    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    return None


def pytest_configure(config: pytest.Config) -> None:
    """With pytest-xdist workers (``-n``): hand out the groups in collection order, and make Ray's token
    file before any worker starts a cluster.

    Order: pytest-xdist hands out the groups with the most tests first by default, which put the long
    integration files (a few tests of half a minute each) last and left one worker running them alone
    at the end; :func:`pytest_collection_modifyitems` orders the groups itself.

    Token: a local ``ray.init()`` writes ``~/.ray/auth_token`` when there is none; two workers starting
    their first clusters at once (a fresh CI machine) would each write their own, and a cluster whose
    token was overwritten refuses its own workers. ``ray get-auth-token --generate`` is Ray's documented
    way to make it, and does nothing when it exists."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return  # a worker, or no workers: nothing runs concurrently
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    if (Path.home() / ".ray" / "auth_token").is_file() or shutil.which("ray") is None:
        return
    subprocess.run(["ray", "get-auth-token", "--generate"], capture_output=True, timeout=120, check=True)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # pytest-xdist's ``--dist loadgroup`` runs a group's tests on one worker, in order: one group per
    # file by default, so a module's cluster (a module-scoped fixture) starts once. A module that must
    # not run beside another names a shared group itself (``pytestmark``).
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
    # Longest first, as far as collection can tell: groups holding a test marked ``slow``, then the other
    # integration groups (each starts a cluster or processes), then the unit tests, each kind with the most
    # tests first (pytest-xdist's own order, turned off in pytest_configure). Long groups start early and
    # quick ones fill in beside them, instead of one long group running alone at the end.
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        marker = item.get_closest_marker("xdist_group")
        groups.setdefault(str(marker.args[0] if marker.args else marker.kwargs.get("name")), []).append(item)
    order = sorted(groups.values(), key=lambda g: (not any(i.get_closest_marker("slow") for i in g),
                                                   not any("integration" in i.path.parts for i in g), -len(g)))
    items[:] = [item for group in order for item in group]
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    reason = _gpu_skip_reason()
    if reason is None:
        return
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def tmp_log_dir(tmp_path: Path) -> Path:
    """A fresh folder for engine logs; its files show up in pytest's tmp_path on failure."""
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    return log_dir


@pytest.fixture
def write_table():
    """Writes a routing table with one bucket per engine config (le256, le1024, ...) through the real
    ``orchestrator.table.commit`` and returns its path: the tables Serve tests deploy or size up."""
    from orchestrator import table as routing
    from orchestrator.fsutil import utc_now_iso

    def write(path: Path, configs) -> Path:
        data = {
            "provenance": {"model": "/ckpt", "gpu_type": "H200", "gpu_count": 1, "sweep_id": "s",
                           "created_at": utc_now_iso(), "simulated": False},
            "buckets": [{"name": f"le{256 * 4 ** i}", "max_output_len": 256 * 4 ** i, "config": c.to_dict(),
                         "figures": {"output_throughput": 1.0}} for i, c in enumerate(configs)],
        }
        routing.commit(data, path)
        return path

    return write


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A checkpoint folder just real enough for the sweep's CLI to accept ``--model`` (its config
    names the model type); nothing loads weights from it."""
    import json

    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3_5"}))
    return d


SIM_MODEL = "intern-s2-preview-8xh200"
"""The simulator profile the Serve tests serve (a shipped profile: the simulated engine loads it by name)."""


@pytest.fixture(scope="session")
def write_sim_table():
    """Writes a routing table of simulated engines through the real ``orchestrator.table.commit`` and
    returns its path: ``buckets`` is ``[(name, max_output_len, EngineConfig), ...]``; the provenance
    says SIMULATED. The tables the Serve, bad-input, security and deploy tests deploy."""
    from orchestrator import table as routing
    from orchestrator.fsutil import utc_now_iso

    def write(path: Path, buckets, *, sweep_id: str, default_max_tokens: int = 16,
              figures: dict | None = None, cells: dict | None = None) -> Path:
        """``cells``: bucket name -> ``[(sampling band, min_in_flight, EngineConfig), ...]`` (a v2 table)."""
        routing.commit({
            "provenance": {"model": SIM_MODEL, "gpu_type": "none (simulated)", "gpu_count": 0, "sweep_id": sweep_id,
                           "created_at": utc_now_iso(), "simulated": True},
            "buckets": [{"name": name, "max_output_len": max_len, "config": cfg.to_dict(),
                         "figures": dict(figures or {"output_throughput": 1000.0}),
                         "cells": [{"sampling": band, "min_in_flight": level, "config": c.to_dict(),
                                    "figures": dict(figures or {"output_throughput": 1000.0})}
                                   for band, level, c in (cells or {}).get(name, [])]}
                        for name, max_len, cfg in buckets],
            "default_max_tokens": default_max_tokens,
        }, path)
        return path

    return write


@pytest.fixture(scope="session")
def serve_app():
    """A context manager that runs one Serve app on a fresh local Ray cluster: ``ray.init`` (local,
    ``num_cpus``), Serve's proxy on 127.0.0.1 at a free port, ``orchestrator.deploy.deploy(args)``;
    yields the proxy's base URL and shuts Serve and Ray down on exit. Module fixtures of the Serve
    tests use it (one cluster per module)."""
    import contextlib

    @contextlib.contextmanager
    def run(args: dict, *, app_name: str, num_cpus: int = 2, http_options: dict | None = None):
        ray = pytest.importorskip("ray")
        serve = pytest.importorskip("ray.serve")
        from orchestrator.deploy import deploy
        from orchestrator.ports import find_free_port

        port = find_free_port()
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port, **(http_options or {})})
            deploy(args, app_name=app_name)
            yield f"http://127.0.0.1:{port}"
        finally:
            serve.shutdown()
            ray.shutdown()

    return run


@pytest.fixture(scope="session")
def sim_app_args():
    """Builds the deploy args of a test app of simulated engines: ``routing_table``, the engines'
    ``log_dir``, quick health checks and shutdowns and no CPU reservations (tests run on 2 cores),
    then ``overrides`` merged in (``engine`` / ``router`` dicts key by key)."""

    def build(table_path: Path, log_dir: Path, **overrides) -> dict:
        args = {
            "routing_table": str(table_path),
            "engine": {"health_check_period_s": 2, "health_check_timeout_s": 10, "health_timeout_s": 3,
                       "num_cpus": 0, "graceful_shutdown_timeout_s": 5, "graceful_shutdown_wait_loop_s": 0.5,
                       "log_dir": str(log_dir)},
            "router": {"num_cpus": 0, "graceful_shutdown_timeout_s": 5, "graceful_shutdown_wait_loop_s": 0.5},
        }
        for key, value in overrides.items():
            args[key] = {**args[key], **value} if key in ("engine", "router") else value
        return args

    return build


@pytest.fixture(scope="session")
def listening():
    """``listening(port)``: the local addresses (hex, as ``/proc/net/tcp{,6}`` write them: ``0100007F`` is
    127.0.0.1) with a socket listening on ``port`` — what a test checks to say nothing is public."""

    def addresses(port: int) -> list[str]:
        out = []
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                lines = Path(table).read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                fields = line.split()
                addr, hexport = fields[1].split(":")
                if int(hexport, 16) == port and fields[3] == "0A":  # 0A = LISTEN
                    out.append(addr)
        return out

    return addresses

