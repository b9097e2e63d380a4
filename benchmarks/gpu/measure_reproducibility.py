"""Two independent sweeps of one space, their tables re-measured side by side (issue #22 item 2): does
the sweep commit the same answer twice, within 3 % on the mix?

Both sweeps run the same space on the same GPU (``--share-gpu``, ``--repeats`` rounds, so every
compared figure has an interval and co-resident configs take turns round by round; the baselines run
alone) with different search seeds and run dirs, over the buckets, the sampling temperatures and the
stated traffic mix (``--traffic-mix``), so a table may give a sampling band its own config. Then both
committed tables are deployed side by side as two Serve apps (``/a`` and ``/b``, every engine at
``--serve-memory-fraction`` so both fit one GPU; an idle neighbour showed no detectable effect), warmed
up by driving the mix unmeasured for ``--warm-up-s`` (a fresh engine's first full-length and first
sampled batches run slow; whether one short pass leaves that in the first rounds is not settled), and
measured in alternating order for ``--rounds`` rounds (a, b; b, a; ...): the mix is the stated mix's
classes (each class's share of ``--mix-requests`` requests, drawn from its bucket's sweep workload, at the
class's temperature), shuffled, in one closed loop at the sweeps' concurrency, so each table's router
picks its cell per request. The result is the per-round ratio b / a with its 95 % CI (which assumes the
rounds independent: a drift over the rounds breaks that), each table's choices and the routes where the
two tables differ.

The sweeps and the side-by-side part need not share a lease: ``--reuse --work DIR`` keeps every
``DIR/sweep-<tag>/`` that holds ``routing_table.json`` and ``sweep.json`` (the collect step copies both
out, and ``weights.json``), so a later lease re-measures committed tables. They compare only on the same
weights: each sweep's folder records the sha256 of the checkpoint it measured (``weights.json``), and a
table measured on other weights is refused. A trained checkpoint differs between leases (GPU
nondeterminism), so leases that share tables build theirs (``tuning.checkpoint.build --agreement``: drawn
on the CPU from a seed, the same bytes every time).

    python -m benchmarks.gpu.measure_reproducibility --ckpt /root/ckpt --out $OUT        # on the GPU machine
    python -m benchmarks.gpu.measure_reproducibility --sim --out /tmp/repro              # dry run, simulated
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# e2e: the e2e run's Ray cluster, sweep command, deploy and mixed-load helpers
from benchmarks.gpu import e2e
from benchmarks.gpu.e2e import HTTP_PORT, log
from orchestrator import table as routing
from tuning.payoff import with_memory_fraction
from tuning.reproducibility import (
    SEEDS,
    WEIGHTS_RECORD,
    choices,
    mix_requests,
    noise_space,
    parse_sim_noise,
    route_differences,
    routes,
    stop_after_sweeps,
    sweep_flags,
    weights,
    weights_differences,
)
from tuning.stats import mean_confidence_interval

GOAL = 0.03


def sweep(tag: str, a: argparse.Namespace, record: Mapping[str, Any]) -> dict[str, Any]:
    run_dir = Path(a.work) / f"sweep-{tag}"
    if (run_dir / "routing_table.json").exists() and a.reuse:
        return {"run_dir": str(run_dir), "reused": True}
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = e2e.sweep_cmd(a, run_dir, sweep_id=f"repro-{tag}", num_trials=a.num_trials, share=True,
                        time_budget_s=a.time_budget_s)
    cmd[cmd.index("--seed") + 1] = str(SEEDS[tag])
    space = None
    if (noisy := noise_space(a)) is not None:  # every simulated engine varies (its flags beside the defaults')
        space = Path(a.work) / f"space-{tag}.json"  # JSON is YAML: the sweep's --space reads it
        space.write_text(json.dumps(noisy))
    cmd += sweep_flags(a, space)  # its hard limit leaves it the time to commit a table before the timeout
    run_dir.mkdir(parents=True)  # the record first: a table is never in the folder without it
    (run_dir / WEIGHTS_RECORD).write_text(json.dumps(record, indent=1))
    t = time.monotonic()
    proc = e2e.run(cmd, timeout=a.sweep_timeout_s, check=False, log_to=Path(a.out) / f"sweep_{tag}.log")
    out = {"run_dir": str(run_dir), "rc": proc.returncode, "wall_s": round(time.monotonic() - t, 1), "command": " ".join(cmd)}
    if (run_dir / "results.csv").exists():
        out.update(e2e.summarize_run(run_dir))
    e2e.pack(run_dir, Path(a.out) / f"sweep_{tag}_run.tgz")
    return out


def deploy(tag: str, table_path: Path, a: argparse.Namespace) -> dict[str, Any]:
    if not a.sim:  # every engine small enough that both apps are resident on the GPU at once
        served = Path(a.work) / f"table_{tag}_served.json"
        served.write_text(json.dumps(with_memory_fraction(json.loads(table_path.read_text()),
                                                          a.serve_memory_fraction), indent=1))
        table_path = served
    cmd = e2e.deploy_cmd(table_path, share=not a.sim, log_dir=Path(a.work) / f"serve-logs-{tag}", sim=a.sim)
    cmd[cmd.index("--app-name") + 1] = f"repro-{tag}"
    cmd += ["--route-prefix", f"/{tag}"]
    proc = e2e.run(cmd, timeout=600, check=False)
    return {"rc": proc.returncode, "command": " ".join(cmd)}


def mixed(tag: str, reqs: list[tuple[str, int, float]], concurrency: int) -> dict[str, Any]:
    import asyncio

    import openai

    base = f"http://127.0.0.1:{HTTP_PORT}/{tag}"
    model = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0).models.list().data[0].id
    return asyncio.run(e2e._closed_loop(base, model, reqs, concurrency))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", default="/root/ckpt")
    p.add_argument("--out", required=True)
    p.add_argument("--work", default="/root/repro")
    p.add_argument("--sim", action="store_true", help="the same flow on simulated engines (no GPU)")
    p.add_argument("--sim-noise", type=parse_sim_noise, default=None, metavar="START_SD,SD",
                   help="with --sim: simulated engines that vary as GPU engines do, by a log sd per engine start "
                   "and one per 5 simulated seconds (e.g. 0.05,0.1), so that the decide phase and the hard limit "
                   "run as on the GPU")
    p.add_argument("--reuse", action="store_true", help="keep a sweep whose table is already in --work (a later call)")
    p.add_argument("--sweeps", default="a,b", help="which sweeps to run now (a, b or both; none: only the side by "
                   "side, of tables already in --work, with --reuse): one per lease where a sweep with a long "
                   "decide phase fills one; the side by side runs once both tables are in --work")
    p.add_argument("--no-side-by-side", action="store_true",
                   help="stop after the sweeps even when both tables are in --work (where the side by side does "
                   "not fit the lease beside a sweep: a later call serves them with --sweeps none --reuse)")
    p.add_argument("--buckets", default="256,1024")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--temperatures", default="0,0.8", help="sampling temperatures each sweep measures")
    p.add_argument("--traffic-mix", default=str(Path(__file__).with_name("payoff_mix_test_ckpt.yaml")),
                   help="the stated mix: the sweeps' table-pays prediction and the side-by-side workload")
    p.add_argument("--mix-requests", type=int, default=128, help="requests in one pass of the mix")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--num-trials", type=int, default=2,
                   help="trials per sweep, the two baselines (MTP off, MTP-4) included")
    p.add_argument("--repeats", type=int, default=2,
                   help="rounds per bucket in each sweep (>= 2; configs are compared at the noise pooled "
                        "over the sweep's measurements)")
    p.add_argument("--burn-in-s", type=float, default=30, help="each engine's burn-in in the sweeps")
    p.add_argument("--decide-rounds", type=int, default=0,
                   help="each sweep measures its undecided cell comparisons again, this many rounds (tuning.sweep)")
    p.add_argument("--decide-starts", type=int, default=1,
                   help="split --decide-rounds over this many fresh engines per config, started in alternation "
                        "(tuning.sweep; --decide-rounds must be a multiple of it)")
    p.add_argument("--baseline-memory-fraction", type=float, default=None,
                   help="the compared baselines' memory fraction (tuning.sweep; default its 0.8): a small one lets "
                        "their engines, and the decide phase's, start side by side on the shared GPU")
    p.add_argument("--draft-tokens", default="4")
    p.add_argument("--memory-fractions", default="0.06")
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--session-len", type=int, default=4096)
    p.add_argument("--serve-gpus", type=int, default=None)
    p.add_argument("--serve-memory-fraction", type=float, default=0.02,
                   help="every served engine's memory fraction in the side-by-side part (both tables resident)")
    p.add_argument("--time-budget-s", type=float, default=900, help="per sweep: no trial starts its engine after it")
    p.add_argument("--sweep-timeout-s", type=float, default=1500,
                   help="per sweep: killed after it; its rounds stop STOP_MARGIN_S (210 s) before, so that it "
                   "commits a table from what it measured (tuning.sweep --stop-after-s)")
    p.add_argument("--rounds", type=int, default=6, help="side-by-side rounds of the mix (alternating order)")
    p.add_argument("--warm-up-s", type=float, default=60,
                   help="each app drives the mix unmeasured for this long before the rounds (one pass at least)")
    p.add_argument("--num-cpus", type=int, default=8)
    a = p.parse_args(argv)
    run_now = [] if a.sweeps.strip() == "none" else list(dict.fromkeys(t.strip() for t in a.sweeps.split(",")
                                                                        if t.strip()))
    if (not run_now and a.sweeps.strip() != "none") or any(t not in SEEDS for t in run_now):
        p.error(f"--sweeps {a.sweeps!r}: a comma list of {', '.join(SEEDS)}, or none")
    if a.sim_noise and not a.sim:
        p.error("--sim-noise varies simulated engines: it needs --sim")
    if not run_now and not a.reuse:
        p.error("--sweeps none serves the tables of earlier calls: it needs --reuse (and both in --work)")
    if not run_now and a.no_side_by_side:
        p.error("--sweeps none with --no-side-by-side leaves nothing to do")
    from tuning.buckets import Bucket
    from tuning.traffic import load_mix
    from tuning.workload import load_tokenizer

    mix = load_mix(a.traffic_mix)  # a bad mix fails here, before any engine starts

    out_dir, work = Path(a.out), Path(a.work)
    out_dir.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"simulated": a.sim, "goal": f"tables within {GOAL:.0%} of each other on the mix",
                              "args": vars(a)}

    def save() -> None:
        (out_dir / "reproducibility.json").write_text(json.dumps(result, indent=1, default=str))

    def end(key: str, text: str, rc: int) -> int:
        """Stop here: ``text`` as the result's ``error`` or ``next``, said and saved."""
        result[key] = text
        log(text)
        save()
        return rc

    result["weights"] = now = weights(a.ckpt, a.sim)
    reused = [tag for tag in SEEDS if a.reuse and (work / f"sweep-{tag}" / "routing_table.json").exists()]
    if differ := weights_differences(now, work, reused):  # before a lease is spent on the other sweep
        return end("error", f"tables measured on other weights do not compare ({'; '.join(differ)}): build the "
                   "checkpoint the same way in every lease (tuning.checkpoint.build --agreement), or sweep again", 1)
    again = list(argv if argv is not None else sys.argv[1:])  # for the later call this one prints

    with e2e.ray_cluster([0], sim=a.sim, num_cpus=a.num_cpus):
        for tag in run_now:
            result[f"sweep_{tag}"] = sweep(tag, a, now)
            log(f"sweep {tag}: rc {result[f'sweep_{tag}'].get('rc')}, {result[f'sweep_{tag}'].get('wall_s')} s")
            save()
        paths = {tag: work / f"sweep-{tag}" / "routing_table.json" for tag in SEEDS}
        for tag in SEEDS:  # a sweep of an earlier call, its table in --work: kept only when asked to (--reuse)
            if tag not in run_now and a.reuse and paths[tag].exists():
                result[f"sweep_{tag}"] = {"run_dir": str(paths[tag].parent), "reused": True}
        stop = stop_after_sweeps(run_now, reuse=a.reuse, no_side_by_side=a.no_side_by_side,
                                 present={tag: path.exists() for tag, path in paths.items()},
                                 read_spec=lambda tag: json.loads((work / f"sweep-{tag}" / "sweep.json").read_text()),
                                 again=again, work=work, script=Path(__file__).name)
        if stop is not None:
            return end(stop.key, stop.text, stop.rc)
        tables = {tag: routing.load(p) for tag, p in paths.items()}
        result["choices"] = {tag: choices(t) for tag, t in tables.items()}
        result["same_configs"] = set(tables["a"].distinct_configs()) == set(tables["b"].distinct_configs())
        levels = sorted({1, a.concurrency})
        result["route_differences"] = route_differences(*(routes(tables[t], levels) for t in SEEDS))
        result["same_routing"] = not result["route_differences"]
        log(f"same configs: {result['same_configs']}; routes that differ: {result['route_differences'] or 'none'}")
        spec = json.loads((work / "sweep-a" / "sweep.json").read_text())
        buckets = [Bucket.from_dict(b) for b in spec["buckets"]]
        reqs = mix_requests(buckets, mix, load_tokenizer(None if a.sim else a.ckpt), a.mix_requests)
        result["mix_requests"] = {"requests": len(reqs), "output_tokens": sum(r[1] for r in reqs),
                                  "by_temperature": {f"{t:g}": sum(1 for r in reqs if r[2] == t)
                                                     for t in sorted({r[2] for r in reqs})}}
        for tag in SEEDS:
            result[f"deploy_{tag}"] = deploy(tag, paths[tag], a)
            if result[f"deploy_{tag}"]["rc"] != 0:
                return end("error", f"table {tag} did not deploy", 1)
        for tag in SEEDS:  # unmeasured passes, at least one and --warm-up-s long: fresh engines' first
            t0 = time.monotonic()  # full-length and first sampled batches run slow
            passes = 0
            while passes == 0 or time.monotonic() - t0 < a.warm_up_s:
                mixed(tag, reqs, a.concurrency)
                passes += 1
            result.setdefault("warm_up", {})[tag] = {"passes": passes, "s": round(time.monotonic() - t0, 1)}
        runs: list[dict[str, Any]] = []
        for r in range(a.rounds):
            for tag in (("a", "b") if r % 2 == 0 else ("b", "a")):
                m = mixed(tag, reqs, a.concurrency)
                runs.append({"round": r, "table": tag, **m})
                log(f"round {r} table {tag}: {m['output_throughput']} tok/s, errors {m['errors']}")
                result["runs"] = runs
                save()
        ratios = []
        for r in range(a.rounds):
            by = {x["table"]: x["output_throughput"] for x in runs if x["round"] == r}
            if by.get("a") and by.get("b"):
                ratios.append(by["b"] / by["a"])
        if len(ratios) >= 2:
            m, lo, hi = mean_confidence_interval(ratios)
            result["ratio_b_over_a"] = {"mean": round(m, 4), "ci95": [round(lo, 4), round(hi, 4)],
                                        "per_round": [round(x, 4) for x in ratios]}
            result["within_goal"] = abs(m - 1) <= GOAL
            result["interval_within_goal"] = 1 - GOAL <= lo and hi <= 1 + GOAL
        for tag in SEEDS:
            from ray import serve

            serve.delete(f"repro-{tag}")
    save()
    log(f"ratio b/a: {result.get('ratio_b_over_a')}; same routing: {result.get('same_routing')}; "
        f"within {GOAL:.0%}: {result.get('within_goal')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
