"""What one sweep trial costs on the simulated engine: one engine, the no-argument sweep's four
buckets (256/128/96/96 prompts, concurrency 64) one after the other, as a trial measures them.

Prints wall time, CPU seconds of the simulator process and of this client, and per bucket the figures
and the simulator's own account (``held_wall_s``, ``lateness_s``, steps). SIMULATED figures.

    python benchmarks/sim_trial_cost.py [--time-scale 20] [--draft-tokens 3]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
import urllib.request
from pathlib import Path

from orchestrator.config import EngineConfig
from orchestrator.engine import EngineProcess
from orchestrator.sim.model import DEFAULT_PROFILE
from tuning.bench import SteadyStateRule, benchmark
from tuning.buckets import make_buckets

ROOT = Path(__file__).resolve().parent.parent


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _info(base_url: str) -> dict:
    with urllib.request.urlopen(base_url + "/sim/info", timeout=10) as r:
        return json.load(r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--time-scale", type=float, default=20.0)
    ap.add_argument("--draft-tokens", type=int, default=3, help="0 = MTP off")
    a = ap.parse_args()
    spec = {"speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": a.draft_tokens} if a.draft_tokens else {}
    cfg = EngineConfig(backend="sim", model=DEFAULT_PROFILE, tp=8, memory_fraction=0.8, max_batch_size=64,
                       extra_flags=("--startup-delay", "5"), **spec)
    buckets = make_buckets([1024, 4096, 8192, 16384], num_prompts={1024: 256, 4096: 128, 8192: 96, 16384: 96})
    engine = EngineProcess(cfg, sim_time_scale=a.time_scale, log_dir=tempfile.mkdtemp(prefix="sim-trial-cost-"))
    engine.start()
    try:
        engine.wait_until_ready()
        t0, c0, s0 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF), _cpu_s(engine.pid)
        out = {}
        for b in buckets:
            rule = SteadyStateRule(rel_tolerance=0.02) if b.max_output_len >= 4096 else None
            before, tb = _info(engine.base_url), time.monotonic()
            r = benchmark(engine.base_url, b.workload_at(64), engine_config=cfg, steady_state=rule)
            after = _info(engine.base_url)
            out[b.name] = {
                "wall_s": round(time.monotonic() - tb, 2), "simulated_s": round(r.duration_s, 2),
                "output_tok_s": round(r.output_throughput, 1), "ttft_ms": round(r.ttft_ms.mean, 2),
                "tpot_ms": round(r.tpot_ms.mean, 3), "itl_ms": round(r.itl_ms.mean, 3),
                "accept_length": r.accept_length and round(r.accept_length, 4),
                "held_wall_s": round(after["held_wall_s"] - before["held_wall_s"], 2),
                "steps": after["counters"]["steps"] - before["counters"]["steps"],
                "late_steps": after["counters"]["late_steps"] - before["counters"]["late_steps"],
            }
        c1 = resource.getrusage(resource.RUSAGE_SELF)
        print(json.dumps({
            "SIMULATED": True, "time_scale": a.time_scale, "wall_s": round(time.monotonic() - t0, 2),
            "client_cpu_s": round(c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime, 2),
            "simulator_cpu_s": round(_cpu_s(engine.pid) - s0, 2), "buckets": out}, indent=1))
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
