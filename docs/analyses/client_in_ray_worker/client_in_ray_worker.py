"""Does the sweep's benchmark client measure lower inside a Ray worker than in a plain process?

    python -m docs.analyses.client_in_ray_worker.client_in_ray_worker [--time-scale 4,10] [--rounds 2] [--out docs/analyses/client_in_ray_worker/client_in_ray_worker]

Why: on an H200 (GPU run 4, issue #7) the sweep measured the same engine config 1.2-1.5x below what the
e2e driver measured when serving it. One difference is where ``tuning.bench`` runs: inside the trial's
Ray worker (the sweep) or in a plain process (the e2e driver). This measures that difference alone,
with no GPU: a simulated engine run faster than real time (``--time-scale``: simulated seconds per
wall second) so the client must take ``time-scale`` x the simulated token rate, and the same workload
measured from both places in ABBA order (plain, ray, ray, plain, ...). The simulator's figures are in
simulated time, so if the client keeps up both places report the same throughput; a client that falls
behind shows up as a lower figure from where it runs.

Writes ``<out>.json`` and ``<out>.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from orchestrator.config import EngineConfig
from orchestrator.engine import EngineProcess
from orchestrator.sim.model import DEFAULT_PROFILE
from tuning.bench import benchmark
from tuning.workload import Workload

ROOT = Path(__file__).resolve().parents[3]

PROFILE = DEFAULT_PROFILE


def _measure(url: str, workload: Workload) -> dict[str, Any]:
    r = benchmark(url, workload).to_dict()
    return {"output_throughput": round(r["output_throughput"], 1),
            "ttft_ms_median": round((r.get("ttft_ms") or {}).get("median") or 0.0, 1), "failed": r.get("failed")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--time-scale", default="4,10", help="comma-separated simulated seconds per wall second")
    p.add_argument("--rounds", type=int, default=2, help="ABBA rounds per time scale (4 runs each)")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--port", type=int, default=18555)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "client_in_ray_worker"))
    a = p.parse_args(argv)

    import ray

    workload = Workload(input_len=256, output_len=a.max_tokens, num_prompts=a.prompts, max_concurrency=a.concurrency,
                        warmup_requests=0, ignore_eos=True, name="client")
    ray.init(num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    # One CPU, as a sweep trial reserves; the worker imports the same client.
    in_worker = ray.remote(num_cpus=1)(_measure)
    results: list[dict[str, Any]] = []
    log_dir = tempfile.mkdtemp(prefix="client_in_ray_worker-")
    for scale in (float(s) for s in a.time_scale.split(",")):
        # The profile's own tp (8) and the simulator's defaults, no speculative flags.
        sim = EngineProcess(EngineConfig(backend="sim", model=PROFILE, tp=8), port=a.port, log_dir=log_dir,
                            ready_timeout_s=60, sim_time_scale=scale)
        sim.start()
        try:
            sim.wait_until_ready()
            url = sim.base_url
            for i, where in enumerate(["plain", "ray_worker", "ray_worker", "plain"] * a.rounds):
                r = _measure(url, workload) if where == "plain" else ray.get(in_worker.remote(url, workload))
                results.append({"time_scale": scale, "run": i, "where": where, **r})
                print(f"time scale {scale:g}, run {i}: {where:10s} {r['output_throughput']:>9,.0f} tok/s "
                      f"(simulated time; ~{r['output_throughput'] * scale:,.0f} wall), median TTFT {r['ttft_ms_median']} ms",
                      flush=True)
        finally:
            sim.stop()
    ray_version = ray.__version__
    ray.shutdown()

    summary = []
    for scale in dict.fromkeys(r["time_scale"] for r in results):
        means = {w: statistics.mean(r["output_throughput"] for r in results if r["time_scale"] == scale and r["where"] == w)
                 for w in ("plain", "ray_worker")}
        summary.append({"time_scale": scale, "plain_mean": round(means["plain"], 1),
                        "ray_worker_mean": round(means["ray_worker"], 1),
                        "ratio_ray_worker_vs_plain": round(means["ray_worker"] / means["plain"], 4),
                        "wall_tok_s_approx": round(means["plain"] * scale)})
    meta = {"command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
            "python": platform.python_version(), "ray": ray_version, "platform": platform.platform(),
            "cpus": len(os.sched_getaffinity(0)), "workload": workload.to_dict(), "profile": PROFILE}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "summary": summary, "runs": results}, indent=2))
    lines = ["# Benchmark client inside a Ray worker vs a plain process (simulated engine, no GPU)", "",
             f"`{meta['command']}`; python {meta['python']}, ray {meta['ray']}, {meta['cpus']} CPUs, {meta['platform']}.",
             f"Workload: {a.prompts} streaming completions, 256-token prompts, max_tokens {a.max_tokens} (ignore_eos), "
             f"concurrency {a.concurrency}; ABBA order, {a.rounds} rounds per time scale.", "",
             "| time scale | ~wall tok/s the client takes | plain process (sim tok/s) | Ray worker (sim tok/s) | ratio |",
             "|---|---|---|---|---|"]
    lines += [f"| {s['time_scale']:g} | {s['wall_tok_s_approx']:,} | {s['plain_mean']:,.0f} | {s['ray_worker_mean']:,.0f} | "
              f"{s['ratio_ray_worker_vs_plain']:.3f} |" for s in summary]
    lines += ["", "Figures are in simulated time: equal figures mean the client kept up with the engine from both "
              "places; a client falling behind would report less from where it runs. The engine is the "
              f"simulator ({PROFILE}, no speculative flags), not LMDeploy."]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
