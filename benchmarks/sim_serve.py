"""Shared set-up of the router benchmarks: a one-bucket routing table over one simulated engine,
deployed with the project's Serve app on a local Ray, and prompts of real text.

Used by ``router_overhead.py`` and ``soak_router.py`` so both measure the same deployment.
"""
from __future__ import annotations

import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator import table as routing
from orchestrator.config import EngineConfig
from orchestrator.fsutil import utc_now_iso
from orchestrator.ports import find_free_port
from orchestrator.sim.model import DEFAULT_PROFILE
from orchestrator.sim.tokenizer import sample_text

MODEL = DEFAULT_PROFILE
SIM_MTP3 = EngineConfig(backend="sim", model=MODEL, tp=8, speculative_algorithm="qwen3_5_mtp", num_draft_tokens=3)


def prompts(n: int, tokens: int) -> list[str]:
    """``n`` prompts of exactly ``tokens`` simulator tokens of real text (seeded)."""
    rng = random.Random(0)
    return [sample_text(tokens, rng) for _ in range(n)]


@contextmanager
def served_sim_table(config: EngineConfig, *, work_dir: Path, api_key: str, time_scale: float,
                     num_cpus: int | None, app_name: str, engine_transport: str = "grpc",
                     direct_ingress: bool = False) -> Iterator[str]:
    """Deploy ``config`` as the only bucket behind the router; yields the completions URL.

    ``engine_transport``: the router's ``engine_transport`` option (``grpc`` or ``object_ref``).
    ``direct_ingress``: yield the router replica's own URL (Serve direct ingress, enabled by
    ``RAY_SERVE_ENABLE_DIRECT_INGRESS=1`` or ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``; read with
    :func:`orchestrator.deploy.direct_ingress_urls`) instead of the HTTP proxy's: the request path
    then has no proxy hop.

    Ray and Serve are shut down on exit.
    """
    import ray
    from ray import serve

    from orchestrator.deploy import deploy, direct_ingress_urls

    table_path = work_dir / "routing.json"
    routing.commit({
        "provenance": {"model": MODEL, "gpu_type": "none (simulated)", "gpu_count": 0, "sweep_id": app_name,
                       "created_at": utc_now_iso(), "simulated": True},
        "buckets": [{"name": "all", "max_output_len": 131072, "config": config.to_dict(),
                     "figures": {"output_throughput": 1.0}}],
    }, table_path)
    port = find_free_port()
    # address="local": always a fresh Ray of our own, never a cluster that happens to run on this host.
    ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        deploy({"routing_table": str(table_path), "api_keys": [api_key], "sim_time_scale": time_scale,
                "engine": {"num_cpus": 0, "log_dir": str(work_dir / "engine-logs"), "graceful_shutdown_timeout_s": 20},
                "router": {"num_cpus": 0, "graceful_shutdown_timeout_s": 20, "engine_transport": engine_transport}},
               app_name=app_name)
        base = f"http://127.0.0.1:{port}/v1"
        if direct_ingress:
            urls = direct_ingress_urls(app_name)
            if not urls:
                raise RuntimeError("the router replica serves no HTTP port of its own: direct ingress is off "
                                   "(RAY_SERVE_ENABLE_DIRECT_INGRESS=1 must be set before Ray starts)")
            base = urls[0]  # one router replica
        yield f"{base}/completions"
    finally:
        serve.shutdown()
        ray.shutdown()


def add_serve_arguments(p: Any) -> None:
    """The Serve-path options both router benchmarks take (so their runs are comparable)."""
    p.add_argument("--engine-transport", choices=("grpc", "object_ref"), default="grpc",
                   help="router <- engine replica stream: Serve inter-deployment gRPC (default) or a Ray "
                        "ObjectRef per chunk (Serve's default; what the first measurements used)")
    p.add_argument("--proxy-grpc", action="store_true",
                   help="start Ray with RAY_SERVE_PROXY_USE_GRPC=1 (HTTP proxy <- router replica over gRPC)")
    p.add_argument("--throughput-optimized", action="store_true",
                   help="start Ray with RAY_SERVE_THROUGHPUT_OPTIMIZED=1 (user code on the replica's main loop, "
                        "gRPC between deployments)")
    p.add_argument("--direct-ingress", action="store_true",
                   help="start Ray with RAY_SERVE_ENABLE_DIRECT_INGRESS=1 and send the load to the router replica's "
                        "own HTTP port (no proxy hop; its URL is read from Serve's controller)")
    p.add_argument("--num-cpus", type=int, default=None, help="logical CPUs for ray.init (default: os.cpu_count())")
    p.add_argument("--out-dir", default=None,
                   help="write <out-dir>/<name>.json and .md (overrides --out; the directory is created)")


def apply_serve_env(a: Any) -> dict[str, str]:
    """Set the Ray Serve environment flags the arguments ask for, before Ray starts (the local
    cluster's workers inherit them); returns what was set, for the results file."""
    env: dict[str, str] = {}
    if a.throughput_optimized:
        env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] = "1"
    if a.proxy_grpc:
        env["RAY_SERVE_PROXY_USE_GRPC"] = "1"
    if a.direct_ingress:
        env["RAY_SERVE_ENABLE_DIRECT_INGRESS"] = "1"
    os.environ.update(env)
    return env


def serve_settings(a: Any) -> dict[str, Any]:
    """The Serve-path part of a results record (what differs between runs of the same script)."""
    import ray

    flags = {k: v for k, v in os.environ.items() if k.startswith("RAY_SERVE_") or k == "MALLOC_ARENA_MAX"}
    return {"engine_transport": a.engine_transport, "proxy_grpc": a.proxy_grpc, "direct_ingress": a.direct_ingress,
            "throughput_optimized": a.throughput_optimized, "env": flags, "ray": ray.__version__}
