"""How much can any routing table gain over the best single config, on one GPU and one checkpoint?
Measured precisely enough to say.

Why: issue #7 asks for the tuned table to beat the best single config by 1.15x on the mixed workload.
GPU run 5 measured 1.02x, and its sweep's figures capped any table at 1.08x, but those were one-wave
figures (64 prompts at concurrency 64), which move 12-17 % run to run and are biased by the ramp and
tail of one batch (``docs/analyses/gpu_noise/gpu_noise_h200_2026-11-30.md``). This script measures the
configs that matter on this hardware side by side, with four waves per measurement and two rounds in
alternating order, so that the cap — what the best config per bucket would give over the best single
config, on the buckets in proportion (:mod:`tuning.choose.mix`) — is known to a few percent.

All engines start together on the one GPU (each reserves a small KV pool), are warmed up together
(warm-up requests and one unmeasured run of every bucket), then measured one at a time: per round and
bucket, every config once, the order rotating and reversing between rounds (so a drift of the machine
touches all configs alike).

    python -m docs.analyses.table_cap.measure_table_cap --ckpt /root/ckpt --out $OUT [--deadline-s 540]
    python -m docs.analyses.table_cap.measure_table_cap --sim --out /tmp/cap     # dry run, simulated engines

``--out``/``table_cap.json`` is rewritten after every run (a timeout keeps what was measured).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]


def log(msg: str) -> None:
    print(f"[cap {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def summarize(runs: list[dict[str, Any]], buckets: list[Any]) -> dict[str, Any]:
    """Per config and bucket the runs and their mean; the cap from the means and from each round."""
    import pandas as pd

    from tuning.choose.mix import (
        bucket_prompts,
        bucket_tokens,
        per_config_throughput,
        predict,
    )

    ok = [r for r in runs if r.get("output_throughput") and not r.get("failed")]
    if not ok:
        return {}
    df = pd.DataFrame([{**r, "status": "ok", "primary_load": True, "engine_key": r["config"]} for r in ok])
    figures: dict[str, dict[str, Any]] = {}
    for (cfg, bucket), g in df.groupby(["config", "bucket"]):
        vals = g["output_throughput"].tolist()
        figures.setdefault(cfg, {})[bucket] = {
            "runs": [round(v, 1) for v in vals], "mean": round(statistics.fmean(vals), 1),
            "spread": round((max(vals) - min(vals)) / statistics.fmean(vals), 4),
            "accept_length": round(float(g["accept_length"].mean()), 3) if g["accept_length"].notna().any() else None,
        }
    tokens = bucket_tokens(df, bucket_prompts(buckets))
    out: dict[str, Any] = {"tokens": tokens, "figures": figures}
    if len(tokens) != len(buckets):
        return out

    def cap(frame: pd.DataFrame) -> dict[str, Any] | None:
        per_config = per_config_throughput(frame)
        if set(frame["bucket"]) != set(tokens):
            return None  # a round the deadline cut short
        pred = predict(per_config, tokens)
        if pred.best_single is None:
            return None
        best = {b: max(per_config, key=lambda k: per_config[k].get(b, 0.0)) for b in tokens}
        return {"per_bucket_best": best, "per_bucket_tput": round(pred.per_bucket_throughput, 1),
                "best_single": pred.best_single[0], "best_single_tput": round(pred.best_single[1], 1),
                "ratio": round(pred.ratio, 4), "singles": [(k, round(v, 1)) for k, v in pred.singles]}

    out["cap"] = cap(df)
    out["cap_by_round"] = {int(r): cap(g) for r, g in df.groupby("round")}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="measure_table_cap.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", default="/root/ckpt", help="checkpoint (LMDeploy); ignored with --sim")
    p.add_argument("--sim", action="store_true", help="simulated engines (a dry run of this script; no GPU figure)")
    p.add_argument("--out", required=True)
    p.add_argument("--buckets", default="256,1024,2048", help="output lengths (max; drawn in [0.5x, 1x] as in the sweep)")
    p.add_argument("--draft-tokens", default="0,2,3,4", help="configs: draft tokens, 0 = MTP off")
    p.add_argument("--prompts", type=int, default=256, help="prompts per measured run (256 = four waves at 64)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--memory-fraction", type=float, default=0.06)
    p.add_argument("--deadline-s", type=float, default=540, help="no run starts after this (from the script's start)")
    a = p.parse_args(argv)

    from benchmarks.gpu.engines import measured_engine
    from orchestrator.config import EngineConfig
    from orchestrator.engine import EngineProcess
    from orchestrator.hostinfo import measured_on
    from tuning.bench import benchmark
    from tuning.buckets import make_buckets
    from tuning.workload import load_tokenizer

    t0 = time.monotonic()
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    buckets = list(make_buckets([int(b) for b in a.buckets.split(",")], concurrency_levels=(a.concurrency,),
                                num_prompts=a.prompts))
    configs: dict[str, EngineConfig] = {}
    for n in (int(x) for x in a.draft_tokens.split(",")):
        cfg = measured_engine(a.ckpt, sim=a.sim, draft_tokens=n, memory_fraction=a.memory_fraction,
                              max_batch_size=a.concurrency)
        configs[cfg.label()] = cfg
    tokenizer = load_tokenizer(None if a.sim else a.ckpt)
    result: dict[str, Any] = {"command": " ".join([sys.executable, *sys.argv]), "simulated": a.sim,
                              "engines": {k: c.to_dict() for k, c in configs.items()}, "host": measured_on(),
                              "python": platform.python_version(), "buckets": [b.to_dict() for b in buckets],
                              "runs": [], "summary": {}}

    def save() -> None:
        result["summary"] = summarize(result["runs"], buckets)
        result["elapsed_s"] = round(time.monotonic() - t0, 1)
        (out_dir / "table_cap.json").write_text(json.dumps(result, indent=1))

    engines = {k: EngineProcess(c, log_dir=out_dir / "engine-logs", ready_timeout_s=420,
                                sim_time_scale=50.0 if a.sim else None) for k, c in configs.items()}
    pool = concurrent.futures.ThreadPoolExecutor(len(engines))
    try:
        for e in engines.values():
            e.start()
        for e in engines.values():
            e.wait_until_ready()
        result["engines_ready_s"] = round(time.monotonic() - t0, 1)
        log(f"{len(engines)} engines ready after {result['engines_ready_s']} s: {', '.join(engines)}")

        def burn_in(e: Any) -> None:
            for i, b in enumerate(buckets):
                wl = dataclasses.replace(b.workload, num_prompts=a.concurrency,
                                         warmup_requests=a.concurrency if i == 0 else 0)
                benchmark(e.base_url, wl, tokenizer=tokenizer, request_timeout_s=600)

        list(pool.map(burn_in, engines.values()))  # together: nothing is measured yet
        result["burned_in_s"] = round(time.monotonic() - t0, 1)
        log(f"warm-up and one run of every bucket on every engine done at {result['burned_in_s']} s")
        last: dict[tuple[str, str], float] = {}
        names = list(engines)
        for rnd in range(a.rounds):
            order = names[rnd % len(names):] + names[:rnd % len(names)]
            if rnd % 2:
                order.reverse()
            for b in buckets:
                for name in order:
                    if time.monotonic() - t0 + last.get((name, b.name), 0) > a.deadline_s:
                        log(f"deadline: skipping {name} {b.name} of round {rnd}")
                        continue
                    t = time.monotonic()
                    r = benchmark(engines[name].base_url, b.workload, tokenizer=tokenizer,
                                  request_timeout_s=600).to_dict()
                    last[(name, b.name)] = time.monotonic() - t
                    row = {"round": rnd, "config": name, "bucket": b.name, "num_prompts": b.workload.num_prompts,
                           "output_throughput": r.get("output_throughput"),
                           "request_throughput": r.get("request_throughput"), "duration_s": r.get("duration_s"),
                           "completed": r.get("completed"), "failed": r.get("failed"),
                           "accept_length": r.get("accept_length"),
                           "ttft_ms_median": (r.get("ttft_ms") or {}).get("median"),
                           "at_s": round(time.monotonic() - t0, 1)}
                    result["runs"].append(row)
                    log(f"round {rnd} {b.name} {name}: {row['output_throughput'] or 0:,.0f} tok/s "
                        f"in {row['duration_s'] or 0:.1f} s")
                    save()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        with concurrent.futures.ThreadPoolExecutor(len(engines)) as stopper:  # a hung shutdown costs 30 s once
            list(stopper.map(lambda e: e.stop(), engines.values()))
        save()
    cap = result["summary"].get("cap")
    if cap:
        log(f"best per bucket {cap['per_bucket_best']}: {cap['per_bucket_tput']:,.0f} tok/s; best single "
            f"{cap['best_single']}: {cap['best_single_tput']:,.0f} tok/s; cap {cap['ratio']:.3f}x")
        for rnd, c in result["summary"]["cap_by_round"].items():
            if c:
                log(f"round {rnd} alone: cap {c['ratio']:.3f}x (best single {c['best_single']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
