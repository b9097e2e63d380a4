"""Does a routing table with cells pay on a mixed workload? The served table against every config of
its candidate set served alone on the same number of engines, side by side, in interleaved rounds,
driven by :mod:`tuning.drive` with the same traffic mix and load profile (ramp and burst); goodput
per phase and overall, and the ratio table / best single config with its confidence interval.

By default the engines are the simulator on the published profile (``intern-s2-preview-8xh200``),
labelled SIMULATED. Every such drive checks that each engine of the driven app kept its schedule
(``/sim/info`` lateness counters, read from every engine replica directly); a drive whose engines fell
behind is recorded and left out of every figure, and a round with such a drive gives no ratio. A table
of real engines (a GPU sweep's) deploys real engines (``--share-gpu``: several on one GPU) and every
drive counts; ``benchmarks/gpu/staging/turbomind_device.sh payoff`` runs it on the H200.

Every drive also records each class's share of its goodput (``classes``). Those shares cannot stand in
for the cap (the best any table could do): in a closed loop a single config's share for a class is its
overall rate times the class's share of the stream, so the per-class best of the singles comes out at
about the best single config, which a table that lets engines specialise can beat. So the cap is served
as an app of its own (``--cap``, default on): before the rounds every single app serves each part of
the stated mix (bucket x sampling band) alone, a steady ``--cap-seconds`` drive at the ramp's target
load; :func:`tuning.choose.cap.best_routing` routes the parts on the table's number of replicas from those
rates, and that routing is deployed as ``cap`` (or, when it is one config everywhere, that single's app
stands for it; when it is the table's own routing on its replicas, the table does) and driven in every
round beside the table: the ratio table / cap with its interval.

Real engines are warmed up before anything is measured (``--warm-up``, on by default for them): every
app, and the cap when it is deployed, serves one unmeasured drive of the stated mix at the burst's load
for as long as the sweep's burn-in (``--warm-up-s``).
A fresh PyTorch engine's first full-length requests run slow, and its first sampled requests with MTP on
stall for seconds while the sampling kernels compile; without the warm-up the app driven first on fresh
engines (the cap's selection, the table's first round) pays for it and the comparison ranks start-up.

Apps (one Ray, one Serve; all deployed at once, their engines starting side by side, before the first drive,
each at its own route prefix):

- ``table``: the routing table as the sweep committed it, on the replicas it planned for its GPU budget
  (``--serve-gpus``: ``provenance.gpu_budget.replicas``), else one engine per distinct config;
- ``table-cells-at-any-load`` (``--fixed-cells``, for tables from before the sweep wrote a cell found
  at the bucket's lowest measured load with ``min_in_flight`` 1): the same table with such cells
  holding from one request in flight;
- ``single-<config>``: one config for every request, on as many replicas as the table runs in all;
  the candidates are the table's configs, and with ``--sweep-dir`` every config the sweep measured.
- ``cap``: the best routing of the stated mix's parts over the singles' configs (above), deployed after
  the selection drives.

    python -m tuning.sweep --buckets 1024,4096,8192 --temperatures 0,0.8 --concurrency 16,64 --backends pytorch \
        --memory-fraction 0.9 --num-draft-tokens 1,2,3,4 --serve-gpus 16 --run-dir /tmp/mp/sweep \
        --traffic-mix benchmarks/results/mixed_payoff_sim_2026-12-01_mix.yaml
    python benchmarks/mixed_payoff.py --table /tmp/mp/sweep/routing_table.json --sweep-dir /tmp/mp/sweep \
        --levels 16,32,64 --time-scale 1 --rounds 3 --other-mixes "" --name mixed_payoff_sim_<date>  # ~32 min, 2 cores
    python benchmarks/mixed_payoff.py --render benchmarks/results/mixed_payoff_sim_<date>.json   # tables

Two shared cores keep two simulated engines per app on schedule at 64 in flight each (time scale 1);
four engines per app fell behind (see the results' *Faithfulness*).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

from tuning.payoff import (
    class_goodputs,
    gpus_reserved,
    measure_cap,
    render_markdown,
    summarize,
    with_memory_fraction,
)

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_TABLE = RESULTS / "mixed_payoff_sim_2026-12-01_table.json"
DEFAULT_MIX = RESULTS / "mixed_payoff_sim_2026-12-01_mix.yaml"

OTHER_MIXES: dict[str, dict[str, Any]] = {
    # Chat-heavy: a chat product where a fifth of the calls are greedy tool calls.
    "chat-heavy": {"default_temperature": 0.7, "classes": [
        {"max_tokens": 1024, "temperature": 0.0, "share": 0.10}, {"max_tokens": 4096, "temperature": 0.0, "share": 0.06},
        {"max_tokens": 8192, "temperature": 0.0, "share": 0.04}, {"max_tokens": 1024, "temperature": 0.8, "share": 0.40},
        {"max_tokens": 4096, "temperature": 0.8, "share": 0.24}, {"max_tokens": 8192, "temperature": 0.8, "share": 0.16}]},
    # Greedy only: code completion / extraction; sampling bands do not matter, only the length buckets.
    "greedy-only": {"default_temperature": 0.7, "classes": [
        {"max_tokens": 1024, "temperature": 0.0, "share": 0.5}, {"max_tokens": 4096, "temperature": 0.0, "share": 0.3},
        {"max_tokens": 8192, "temperature": 0.0, "share": 0.2}]},
}


def log(msg: str) -> None:
    print(f"[payoff {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load_profile_for(engines: int, levels: tuple[int, int, int] = (16, 32, 64), scale: float = 1.0) -> dict[str, Any]:
    """Per engine: ``levels[0]`` requests in flight for 60 s, a ramp to ``levels[1]`` over 60 s, a 30-s
    burst of ``levels[2]``, ``levels[0]`` again for 60 s; times in simulated s, ``scale`` stretches them."""
    low, high, burst = levels
    return {"phases": [
        {"seconds": 60 * scale, "concurrency": low * engines, "name": "steady"},
        {"seconds": 60 * scale, "ramp_to": high * engines, "name": "ramp"},
        {"seconds": 30 * scale, "concurrency": burst * engines, "name": "burst"},
        {"seconds": 60 * scale, "concurrency": low * engines, "name": "after burst"}]}


def cells_at_any_load(table_data: dict[str, Any]) -> dict[str, Any]:
    """The table with every cell measured at its bucket's primary concurrency holding from 1 in flight."""
    out = json.loads(json.dumps(table_data))
    for b in out["buckets"]:
        levels = (out.get("provenance", {}).get("workload", {}).get("buckets", {}).get(b["name"], {})
                  .get("concurrency_levels") or [None])
        for c in b.get("cells", []):
            if c.get("min_in_flight") == levels[0]:
                c["min_in_flight"] = 1
    return out


def single_table(table_data: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """A one-bucket table serving every request (up to the table's longest bucket) with ``config``."""
    prov = {k: v for k, v in table_data["provenance"].items() if k != "gpu_budget"}
    return {"provenance": prov, "default_max_tokens": table_data.get("default_max_tokens", 1024),
            "buckets": [{"name": "all", "max_output_len": max(b["max_output_len"] for b in table_data["buckets"]),
                         "config": config, "figures": {"output_throughput": 1.0}}]}


def engine_urls(app: str, replicas: dict[str, int]) -> list[str]:
    """Every engine replica's URL of ``app`` (``replicas``: engine key -> replicas; a handle reaches one
    replica per call: ask until all answered)."""
    from ray import serve

    urls: set[str] = set()
    for key, n in replicas.items():
        h = serve.get_deployment_handle(key, app_name=app)
        seen: set[str] = set()
        for _ in range(50 * n):
            seen.add(h.engine_info.remote().result(timeout_s=60)["base_url"])
            if len(seen) == n:
                break
        if len(seen) < n:
            raise RuntimeError(f"{app}/{key}: found {len(seen)} of {n} engine replicas")
        urls |= seen
    return sorted(urls)


def measured_configs(sweep_dir: str | Path) -> dict[str, dict[str, Any]]:
    """Engine key -> config of every config a sweep measured successfully (its ``results.parquet``)."""
    import pandas as pd

    from tuning.results import STATUS_OK, config_of_row

    df = pd.read_parquet(Path(sweep_dir) / "results.parquet")
    return {str(r["engine_key"]): config_of_row(r) for r in df[df["status"] == STATUS_OK].to_dict("records")}


async def _counters(urls: list[str]) -> dict[str, dict[str, float]]:
    import aiohttp

    from tuning.drive.backend import sim_counters_of

    out = {}
    async with aiohttp.ClientSession() as s:
        for u in urls:
            async with s.get(u + "/sim/info", timeout=aiohttp.ClientTimeout(total=30)) as r:
                out[u] = sim_counters_of(await r.json())["engine"]
    return out


def renice_descendants(niceness: int = 0) -> int:
    """Set the niceness of every process this script started (Ray's workers run at 15, and so do the
    engines they start) to ``niceness``: on a shared host the engines then compete with other work on
    equal terms instead of falling behind their schedule. Returns how many were changed."""
    import os

    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    todo, changed = list(children.get(os.getpid(), [])), 0
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            if os.getpriority(os.PRIO_PROCESS, pid) > niceness:
                os.setpriority(os.PRIO_PROCESS, pid, niceness)
                changed += 1
        except OSError:
            pass  # gone, or not ours to change
    return changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mixed_payoff.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--table", default=str(DEFAULT_TABLE), help="the sweep's routing table (simulated engines, or "
                   "real ones: a GPU sweep's)")
    p.add_argument("--share-gpu", action="store_true", help="real engines: tp=1 engines share a GPU (each reserves "
                   "its memory fraction + 0.1 of one), so every app fits one GPU")
    p.add_argument("--mix", default=str(DEFAULT_MIX), help="the stated traffic mix")
    p.add_argument("--other-mixes", default="chat-heavy,greedy-only",
                   help=f"comma-separated names of {sorted(OTHER_MIXES)} also driven ('' for none)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--other-rounds", type=int, default=2, help="rounds of the other mixes")
    p.add_argument("--time-scale", type=float, default=2.0,
                   help="simulated engines' speed-up (default 2: what kept four engines on schedule on a shared 2-core "
                        "host at the default levels; 4 did not)")
    p.add_argument("--profile-scale", type=float, default=0.5,
                   help="stretches the load profile's phases (default 0.5: 30 s steady, 30 s ramp, 15 s burst, 30 s)")
    p.add_argument("--levels", default="4,8,16",
                   help="in flight per engine: steady, ramp target, burst (default 4,8,16: what 2 shared cores "
                        "simulate on schedule; the sweep measured at 64)")
    p.add_argument("--apps", default=None, help="comma-separated app names to drive (default: all)")
    p.add_argument("--retries", type=int, default=1, help="drives again whose engines fell behind, up to this often")
    p.add_argument("--sweep-dir", default=None, help="the sweep's run dir: every config it measured is a single-config "
                   "candidate (default: the table's configs only)")
    p.add_argument("--cap", action=argparse.BooleanOptionalAction, default=True,
                   help="measure the cap: every single app serves each part of the stated mix alone, the best routing "
                        "of the parts on the table's replicas is served as app 'cap' beside the table (see above)")
    p.add_argument("--cap-seconds", type=float, default=None,
                   help="length of each cap selection drive (default: the profile's first phase)")
    p.add_argument("--memory-fraction", type=float, default=None,
                   help="real engines: serve every config (table, singles, cap) at this --cache-max-entry-count, "
                        "so that all apps fit the GPUs at once (a small checkpoint's throughput does not depend "
                        "on it while its KV cache holds the batch; the results name the configs as served)")
    p.add_argument("--warm-up", action=argparse.BooleanOptionalAction, default=None,
                   help="before the cap's selection and the rounds, drive every app once with the stated mix at the "
                        "burst's load, unmeasured (default: on for real engines, off for simulated ones, which "
                        "have no first-run effect)")
    p.add_argument("--warm-up-s", type=float, default=None,
                   help="length of each app's warm-up drive (default: the sweep's burn-in, "
                        "tuning.sweep.GPU_BURN_IN_S: a fresh engine keeps speeding up for tens of seconds of load)")
    p.add_argument("--fixed-cells", action=argparse.BooleanOptionalAction, default=False,
                   help="also serve the table with its cells holding at any load (see above)")
    p.add_argument("--renice", action=argparse.BooleanOptionalAction, default=True,
                   help="run this script's Ray workers and engines at niceness 0 (Ray starts them at 15)")
    p.add_argument("--direct-ingress", action=argparse.BooleanOptionalAction, default=True,
                   help="Ray Serve's throughput-optimized mode with direct ingress: requests go to each app's router "
                        "replica, no proxy hop (the least CPU per token on a small host)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-cpus", type=int, default=None)
    p.add_argument("--out-dir", default=str(RESULTS))
    p.add_argument("--name", default="mixed_payoff_sim_2026-12-01")
    p.add_argument("--work-dir", default="/tmp/mixed_payoff")
    p.add_argument("--render", default=None, metavar="JSON", help="print the Markdown tables of a results JSON and exit")
    a = p.parse_args(argv)
    if a.render:  # the summary again from the drives (this script's current rules), then the tables
        path = Path(a.render)
        done = json.loads(path.read_text())
        done["summary"] = summarize(done["drives"], list(done["apps"]), (done.get("cap") or {}).get("app"))
        path.write_text(json.dumps(done, indent=1))
        print(render_markdown(done))
        return 0

    import ray
    from ray import serve

    from orchestrator import table as routing
    from orchestrator.config import EngineConfig
    from orchestrator.deploy import deploy_many, direct_ingress_urls
    from orchestrator.hostinfo import cpu_model, cpus_available, package_versions
    from orchestrator.ports import find_free_port
    from tuning.drive import (
        MLPERF_SERVER_SLO,
        lateness_between,
        overall_figures,
        phase_figures,
        run_drive,
    )
    from tuning.drive.summary import MAX_LAG_SHARE, kept_schedule, max_lag_s
    from tuning.sweep.spec import GPU_BURN_IN_S
    from tuning.traffic import LoadPhase, LoadProfile, TrafficMix, load_mix

    t0 = time.monotonic()
    work = Path(a.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    table_data = json.loads(Path(a.table).read_text())
    if a.memory_fraction is not None:
        table_data = with_memory_fraction(table_data, a.memory_fraction)
    table = routing.parse(table_data)
    configs = {k: c.to_dict() for k, c in table.distinct_configs().items()}
    planned = dict(table.provenance.gpu_budget.replicas) if table.provenance.gpu_budget else {}
    table_replicas = planned or {k: 1 for k in configs}
    n = sum(table_replicas.values())
    apps: dict[str, tuple[dict[str, Any], dict[str, int]]] = {"table": (table_data, table_replicas)}
    if a.fixed_cells:
        apps["table-cells-at-any-load"] = (cells_at_any_load(table_data), table_replicas)
    measured = measured_configs(a.sweep_dir) if a.sweep_dir else {}
    if a.memory_fraction is not None:
        measured = {EngineConfig.from_dict(c).key(): c for c in
                    (dict(c, memory_fraction=a.memory_fraction) for c in measured.values())}
    singles = {**configs, **measured}
    for key, cfg in singles.items():
        apps[f"single-{key}"] = (single_table(table_data, cfg), {key: n})
    mixes: dict[str, TrafficMix] = {"stated": load_mix(a.mix)}
    for name in filter(None, a.other_mixes.split(",")):
        mixes[name] = TrafficMix.model_validate(OTHER_MIXES[name])
    levels = tuple(int(x) for x in a.levels.split(","))
    if len(levels) != 3:
        p.error("--levels takes three numbers: steady, ramp target, burst")
    if a.warm_up_s is not None and not (0 < a.warm_up_s < float("inf")):
        p.error(f"--warm-up-s {a.warm_up_s} must be a positive number of seconds")
    if a.apps:
        apps = {k: v for k, v in apps.items() if k in a.apps.split(",")}
    profile = LoadProfile.model_validate(load_profile_for(n, levels, a.profile_scale))
    slo = MLPERF_SERVER_SLO
    app_configs = {name: routing.parse(d).distinct_configs() for name, (d, _) in apps.items()}
    simulated = all(c.backend == "sim" for cfgs in app_configs.values() for c in cfgs.values())
    result: dict[str, Any] = {
        "command": " ".join([sys.executable, *sys.argv]), "simulated": simulated,
        "host": {"cpu_model": cpu_model(), "cpus": cpus_available(), "python": platform.python_version()},
        "versions": package_versions(("mtp-autotune", "ray", "optuna", "aiohttp")),
        "table": str(a.table), "table_sweep_id": table.provenance.sweep_id, "engines_per_app": n,
        "apps": {name: sorted(cfgs) for name, cfgs in app_configs.items()},
        "mixes": {k: m.model_dump(mode="json") for k, m in mixes.items()}, "profile": profile.model_dump(mode="json"),
        "time_scale": a.time_scale, "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
        "faithfulness_rule": (f"every engine's mean lag over its steps <= {MAX_LAG_SHARE:.0%} of the shortest phase "
                              f"({max_lag_s(profile) * 1000:g} ms simulated); per-request times from the engines' stamps"
                              if simulated else "real engines: no schedule to keep, every drive counts"),
        "drives": [], "summary": {}}
    warm_up = (not simulated) if a.warm_up is None else a.warm_up
    result["warm_up_plan"] = {"on": warm_up, "seconds": GPU_BURN_IN_S if a.warm_up_s is None else a.warm_up_s,
                              "in_flight": levels[2] * n}
    result["warm_up"] = []  # one entry per app as its warm-up drive ends
    out_json = out_dir / f"{a.name}.json"

    def save() -> None:
        result["summary"] = summarize(result["drives"], list(apps), (result.get("cap") or {}).get("app"))
        result["elapsed_s"] = round(time.monotonic() - t0, 1)
        out_json.write_text(json.dumps(result, indent=1))

    if a.direct_ingress:
        import os

        os.environ.update({"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"})
    result["serve_env"] = {k: v for k, v in __import__("os").environ.items() if k.startswith("RAY_SERVE_")}
    port = find_free_port()
    ray.init(address="local", num_cpus=a.num_cpus or cpus_available(), include_dashboard=False, log_to_driver=False)
    if not simulated:  # every app is resident at once: refuse before any engine starts if they cannot be
        need = gpus_reserved(apps, a.share_gpu, cap_engines=n if a.cap else 0)
        have = float(ray.cluster_resources().get("GPU", 0))
        if need > have + 1e-9:
            ray.shutdown()
            raise SystemExit(f"error: the apps reserve {need:g} GPU(s) at once ({len(apps)} apps"
                             + (f" and up to {n} cap engines" if a.cap else "") + f"), the cluster has {have:g}; "
                             "lower every engine's --memory-fraction (with --share-gpu an engine reserves its "
                             "fraction + 0.1 of a GPU), drop singles with --apps, or run with --no-cap")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        urls: dict[str, list[str]] = {}
        bases: dict[str, str] = {}

        def deploy_apps(todo: dict[str, tuple[dict[str, Any], dict[str, int]]]) -> None:
            """Deploy ``todo`` (name -> (table, replicas per engine key)) at once: their engines start side
            by side (:func:`orchestrator.deploy.deploy_many`), then each app's engine and router URLs."""
            specs = []
            for name, (data, replicas) in todo.items():
                path = work / f"{name}.json"
                if path.exists():
                    path.unlink()
                routing.commit(data, path)
                engine = {"num_cpus": 0, "log_dir": str(work / "engine-logs" / name), "health_check_period_s": 30,
                          "health_check_timeout_s": 60, "metrics_poll_s": 60, "graceful_shutdown_timeout_s": 5}
                if not simulated:
                    engine["share_gpu"] = a.share_gpu
                specs.append(({"routing_table": str(path), "engine": engine,
                               "scaling": {k: {"num_replicas": r} for k, r in replicas.items()},
                               **({"sim_time_scale": a.time_scale} if simulated else {}),
                               "router": {"num_cpus": 0, "graceful_shutdown_timeout_s": 5, "status_refresh_s": 30}},
                              name, f"/{name}"))
            deploy_many(specs)
            for name, (_, replicas) in todo.items():
                urls[name] = engine_urls(name, replicas)
                ingress = direct_ingress_urls(name) if a.direct_ingress else []
                bases[name] = ingress[0].removesuffix("/v1") if ingress else f"http://127.0.0.1:{port}/{name}"
                log(f"deployed {name}: {len(urls[name])} engines, router at {bases[name]}")

        def drive_app(app: str, mix: TrafficMix, prof: LoadProfile, seed: int, label: str) -> tuple[Any, Any, bool]:
            """One drive of ``app``; on simulated engines again (``--retries``) while its engines fall behind.
            Returns the drive, the engines' lateness and whether they kept their schedule."""
            for attempt in range(1 + a.retries):
                before = asyncio.run(_counters(urls[app])) if simulated else {}
                res = run_drive(bases[app], mix, prof, seed=seed, drain_s=600)
                if not simulated:  # a real engine has no schedule: every drive counts
                    return res, (), True
                lateness = lateness_between(before, asyncio.run(_counters(urls[app])))
                if kept_schedule(lateness, prof):
                    return res, lateness, True
                result.setdefault("retried", []).append({"drive": label, "app": app, "lateness": [
                    e.__dict__ for e in lateness]})
                log(f"{label} {app}: engines fell behind (attempt {attempt + 1}); "
                    + ("again" if attempt < a.retries else "recorded, left out of the figures"))
            return res, lateness, False

        warm_profile = LoadProfile(phases=[LoadPhase(seconds=result["warm_up_plan"]["seconds"],
                                                     concurrency=levels[2] * n, name="warm-up")])

        def warm(app: str) -> None:
            """One unmeasured drive of ``app`` (see the module's docstring); its figures are kept apart."""
            res, _, _ = drive_app(app, mixes["stated"], warm_profile, a.seed + max(a.rounds, a.other_rounds), "warm-up")
            overall = overall_figures(res.records, warm_profile, slo)
            result["warm_up"].append({"app": app, "goodput": overall.goodput, "throughput": overall.throughput,
                                      "requests": len(res.records), "failed": overall.failed})
            log(f"warm-up {app}: {len(res.records)} requests, goodput {overall.goodput:,.0f} tok/s (not measured)")

        deploy_apps(apps)
        result["deployed_s"] = round(time.monotonic() - t0, 1)
        if a.renice:
            log(f"reniced {renice_descendants(0)} of this run's processes (Ray workers, engines) to 0")
        if warm_up:
            for name in apps:
                warm(name)
        if a.cap:
            seconds = a.cap_seconds or profile.phases[0].seconds
            singles_keys = {app: app.removeprefix("single-") for app in apps if app.startswith("single-")}

            def part_goodput(app: str, part_mix: TrafficMix, part: str) -> float | None:
                prof = LoadProfile(phases=[LoadPhase(seconds=seconds, concurrency=levels[1] * n, name="steady")])
                res, _, ok = drive_app(app, part_mix, prof, a.seed, f"cap selection {part}")
                good = overall_figures(res.records, prof, slo).goodput
                log(f"cap selection {part} {app}: goodput {good:,.0f} tok/s" + ("" if ok else " — FELL BEHIND: left out"))
                return good if ok else None

            cap = measure_cap(table_data, mixes["stated"], singles_keys, n, part_goodput, singles, table_replicas)
            cap.update(seconds=seconds, in_flight=levels[1] * n)
            log(f"cap: {cap.get('note') or cap.get('error')}")
            result["cap"] = cap
            if cap.get("app") == "cap":
                apps["cap"] = (cap.pop("table"), cap["replicas"])
                deploy_apps({"cap": apps["cap"]})
                result["apps"]["cap"] = sorted(cap["replicas"])
                if a.renice:
                    renice_descendants(0)
                if warm_up:
                    warm("cap")
            save()
        names = list(apps)
        plan = [(m, r) for m in mixes for r in range(a.rounds if m == "stated" else a.other_rounds)]
        for mix_name, rnd in plan:
            order = names if rnd % 2 == 0 else names[::-1]  # alternate, so a drift touches all apps alike
            for app in order:
                res, lateness, ok = drive_app(app, mixes[mix_name], profile, a.seed + rnd, f"{mix_name} round {rnd}")
                figs = phase_figures(res.records, profile, slo)
                overall = overall_figures(res.records, profile, slo)
                result["drives"].append({
                    "mix": mix_name, "round": rnd, "app": app, "kept_schedule": ok,
                    "lateness": [e.__dict__ | {"mean_lag_ms": round(e.mean_lag_s * 1000, 3)} for e in lateness],
                    "phases": [f.__dict__ for f in figs], "overall": overall.__dict__,
                    "classes": class_goodputs(res.records, profile, slo, len(mixes[mix_name].classes)),
                    "requests": len(res.records), "failed": sum(1 for r in res.records if not r.ok),
                    "routes": _routes(res.records), "simulated": res.simulated, "time_scale": res.time_scale})
                worst = max((e.mean_lag_s for e in lateness), default=0.0) * 1000
                log(f"{mix_name} round {rnd} {app}: goodput {overall.goodput:,.0f} tok/s, throughput "
                    f"{overall.throughput:,.0f}, {overall.failed} failed, worst engine lag {worst:.2f} ms"
                    + ("" if ok else " — ENGINES FELL BEHIND: left out"))
                save()
    finally:
        serve.shutdown()
        ray.shutdown()
        save()
    for mix_name, entry in result["summary"].items():
        for k, v in entry.items():
            if k.startswith("ratio") and v:
                ref = entry["cap"] if k.endswith("/ cap") else entry["best_single"]
                log(f"{mix_name}: {k} = {v['mean']:.3f} (95 % CI {v['ci95'][0]:.3f}-{v['ci95'][1]:.3f}, n={v['n']}); "
                    f"against {ref}")
    log(f"wrote {out_json}")
    return 0


def _routes(records: Any) -> dict[str, int]:
    from collections import Counter

    return dict(Counter(r.route or "-" for r in records))


if __name__ == "__main__":
    sys.exit(main())
