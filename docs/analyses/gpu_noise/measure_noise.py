"""Run-to-run noise of one real engine's throughput, against how many requests a measurement takes.

Why: the sweep measures a bucket with one wave (64 prompts at concurrency 64) — 1.7 s at ``le256`` and
~6.5 s at ``le2048`` for the 83M test checkpoint on an H200 — and GPU runs 3–5 saw the same engine's
figure move 10–60 % between runs, too much to rank configs that differ by less. Whether more prompts
per measurement fix that, and at what cost in device time, is what the sweep's ``--num-prompts``
should be set from. This script starts one engine (MTP-4, fraction 0.06: run 5's le2048 choice) and
runs the same workload over and over: per round and bucket, ``--small`` prompts twice, then
``--large`` prompts once (interleaved, so a drift of the engine touches both sizes alike), every run
with the same seed (identical requests: what differs is the engine and the client, nothing else).

    python -m docs.analyses.gpu_noise.measure_noise --ckpt /root/ckpt --out $OUT [--deadline-s 300]
    python -m docs.analyses.gpu_noise.measure_noise --sim --out /tmp/noise      # dry run, simulated engine

``--out``/``noise.json`` is rewritten after every run (a timeout keeps what was measured), with per
(bucket, prompts) the throughputs, mean, coefficient of variation and (max - min) / mean.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]


def log(msg: str) -> None:
    print(f"[noise {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (bucket, prompts): how far one measurement is from the next."""
    groups: dict[tuple[str, int], list[float]] = {}
    for r in runs:
        if r.get("output_throughput") and not r.get("failed"):
            groups.setdefault((r["bucket"], r["num_prompts"]), []).append(r["output_throughput"])
    out = {}
    for (bucket, n), vals in sorted(groups.items()):
        mean = statistics.fmean(vals)
        out[f"{bucket}/{n}"] = {
            "bucket": bucket, "num_prompts": n, "runs": len(vals), "output_throughput": [round(v, 1) for v in vals],
            "mean": round(mean, 1),
            "cv": round(statistics.stdev(vals) / mean, 4) if len(vals) > 1 else None,
            "spread": round((max(vals) - min(vals)) / mean, 4),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="measure_noise.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", default="/root/ckpt", help="checkpoint (LMDeploy); ignored with --sim")
    p.add_argument("--sim", action="store_true", help="the simulated engine (a dry run of this script; no GPU figure)")
    p.add_argument("--out", required=True)
    p.add_argument("--buckets", default="256,2048", help="output lengths (max; drawn in [0.5x, 1x] as in the sweep)")
    p.add_argument("--small", type=int, default=64, help="prompts per run, the sweep's size (one wave)")
    p.add_argument("--large", type=int, default=256, help="prompts per run, the larger size (four waves)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--draft-tokens", type=int, default=4, help="0: MTP off")
    p.add_argument("--memory-fraction", type=float, default=0.06)
    p.add_argument("--deadline-s", type=float, default=300, help="no run starts after this (from the script's start)")
    a = p.parse_args(argv)

    from benchmarks.gpu.engines import measured_engine
    from orchestrator.engine import EngineProcess
    from orchestrator.hostinfo import measured_on
    from tuning.bench import benchmark
    from tuning.workload import Workload, load_tokenizer

    t0 = time.monotonic()
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = measured_engine(a.ckpt, sim=a.sim, draft_tokens=a.draft_tokens, memory_fraction=a.memory_fraction,
                          max_batch_size=a.concurrency)
    tokenizer = load_tokenizer(None if a.sim else a.ckpt)
    result: dict[str, Any] = {"command": " ".join([sys.executable, *sys.argv]), "simulated": a.sim,
                              "engine": cfg.to_dict(), "host": measured_on(), "python": platform.python_version(),
                              "runs": [], "summary": {}}

    def save() -> None:
        result["summary"] = summarize(result["runs"])
        result["elapsed_s"] = round(time.monotonic() - t0, 1)
        (out_dir / "noise.json").write_text(json.dumps(result, indent=1))

    def workload(output_len: int, n: int, warmup: int = 0) -> Workload:
        return Workload(dataset="random", input_len=1024, output_len=output_len, range_ratio=0.5, num_prompts=n,
                        max_concurrency=a.concurrency, temperature=0.0, seed=0, ignore_eos=True,
                        warmup_requests=warmup, name=f"le{output_len}")

    buckets = [int(b) for b in a.buckets.split(",")]
    engine = EngineProcess(cfg, log_dir=out_dir / "engine-logs", ready_timeout_s=600,
                           sim_time_scale=50.0 if a.sim else None)
    engine.start()
    try:
        engine.wait_until_ready()
        result["engine_ready_s"] = round(time.monotonic() - t0, 1)
        log(f"engine {cfg.label()} ready after {result['engine_ready_s']} s")
        # As a sweep trial: 64 warm-up requests, then the first bucket once unmeasured (the burn-in).
        benchmark(engine.base_url, workload(buckets[0], a.small, warmup=64), tokenizer=tokenizer, request_timeout_s=600)
        last = {}
        for rnd in range(a.rounds):
            for b in buckets:
                for n in (a.small, a.small, a.large):
                    elapsed = time.monotonic() - t0
                    if elapsed + last.get((b, n), 0) > a.deadline_s:
                        log(f"deadline: skipping le{b}/{n} of round {rnd}")
                        continue
                    t = time.monotonic()
                    r = benchmark(engine.base_url, workload(b, n), tokenizer=tokenizer,
                                  request_timeout_s=600).to_dict()
                    last[(b, n)] = time.monotonic() - t
                    row = {"round": rnd, "bucket": f"le{b}", "num_prompts": n,
                           "output_throughput": r.get("output_throughput"), "duration_s": r.get("duration_s"),
                           "completed": r.get("completed"), "failed": r.get("failed"),
                           "accept_length": r.get("accept_length"),
                           "ttft_ms_median": (r.get("ttft_ms") or {}).get("median"),
                           "at_s": round(time.monotonic() - t0, 1)}
                    result["runs"].append(row)
                    log(f"round {rnd} le{b} x{n}: {row['output_throughput']:,.0f} tok/s in {row['duration_s']:.1f} s")
                    save()
    finally:
        engine.stop()
        save()
    for key, s in result["summary"].items():
        log(f"{key}: mean {s['mean']:,.0f} tok/s over {s['runs']} runs, cv {s['cv']}, spread {s['spread']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
