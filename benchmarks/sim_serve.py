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

from orchestrator.config import EngineConfig
from orchestrator.ports import find_free_port
from orchestrator.sim.tokenizer import sample_text
from tuning import routing

MODEL = "intern-s2-preview-8xh200"
SIM_MTP3 = EngineConfig(backend="sim", model=MODEL, tp=8, speculative_algorithm="qwen3_5_mtp", num_draft_tokens=3)


def prompts(n: int, tokens: int) -> list[str]:
    """``n`` prompts of exactly ``tokens`` simulator tokens of real text (seeded)."""
    rng = random.Random(0)
    return [sample_text(tokens, rng) for _ in range(n)]


@contextmanager
def served_sim_table(config: EngineConfig, *, work_dir: Path, api_key: str, time_scale: float,
                     num_cpus: int | None, app_name: str) -> Iterator[str]:
    """Deploy ``config`` as the only bucket behind the router; yields the completions URL.

    Ray and Serve are shut down on exit.
    """
    import ray
    from ray import serve

    from orchestrator.deploy import deploy

    table_path = work_dir / "routing.json"
    routing.commit({
        "provenance": {"model": MODEL, "gpu_type": "none (simulated)", "gpu_count": 0, "sweep_id": app_name,
                       "created_at": routing.utc_now_iso(), "simulated": True},
        "buckets": [{"name": "all", "max_output_len": 131072, "config": config.to_dict(),
                     "figures": {"output_throughput": 1.0}}],
    }, table_path)
    port = find_free_port()
    ray.init(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        deploy({"routing_table": str(table_path), "api_keys": [api_key], "sim_time_scale": time_scale,
                "engine": {"num_cpus": 0, "log_dir": str(work_dir / "engine-logs"), "graceful_shutdown_timeout_s": 20},
                "router": {"num_cpus": 0, "graceful_shutdown_timeout_s": 20}},
               app_name=app_name)
        yield f"http://127.0.0.1:{port}/v1/completions"
    finally:
        serve.shutdown()
        ray.shutdown()
