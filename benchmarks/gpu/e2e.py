"""End to end on real LMDeploy engines: the sweep, then the Serve app from the table it commits.

Phases (each fits one 10-minute device call; state between calls lives under ``--work``):

- ``sweep``: a Ray cluster on ``--gpus`` (``ray start --head``, the dashboard's metrics port on),
  then the real CLI ``python -m tuning.sweep --model CKPT --address auto ...``: MTP on/off, draft
  tokens and memory fraction over three output buckets plus both baselines; with one GPU the
  engines share it (``--share-gpu``: they start side by side, are measured one at a time).
- ``serve``: ``python -m orchestrator.deploy`` of that table on the same GPU; small and large
  ``max_tokens`` must reach different engines (each engine's own ``/metrics`` counters); the
  router's metrics on Ray's Prometheus endpoint; router vs direct-engine throughput; then the
  mixed workload (every bucket's requests, shuffled) through the tuned table and through the best
  single config of the sweep (deployed alone, then with as many replicas as the table had engines).
- ``two-gpu``: a Ray cluster on two GPUs: a sweep whose trials run two at once (one GPU each), and
  a tp=2 engine inside a Serve replica whose two GPUs come from the replica's reservation.

``--sim`` runs the same flow on the simulated engine without a GPU (a dry run of the orchestration;
no figure from it is a GPU figure). Everything a phase measures goes to ``--out`` as JSON, plus one
tarball of the sweep's run dir.

    python benchmarks/gpu/e2e.py sweep --ckpt /root/ckpt --out $OUT
    python benchmarks/gpu/e2e.py serve --ckpt /root/ckpt --out $OUT
    python benchmarks/gpu/e2e.py two-gpu --ckpt /root/ckpt --out $OUT --gpus 0,1
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator import table as routing
from orchestrator.config import EngineConfig
from orchestrator.fsutil import utc_now_iso

ROOT = Path(__file__).resolve().parents[2]

T0 = time.monotonic()
APP = "mtp"
HTTP_PORT = 8000
METRICS_PORT = 8080
SIM_PROFILE = "tiny-qwen35-1xh200"
SIM_TIME_SCALE = 5.0
"""The simulated engines' speed-up in a dry run: the sweep measures at it and the deploy serves at it."""
# Engine counters per backend: (finished requests, generated tokens).
ENGINE_COUNTERS = {
    "lmdeploy": ("lmdeploy:request_success_total", "lmdeploy:generation_tokens_total"),
    "sim": ("sim_requests_total", "sim_generation_tokens_total"),
}


def log(msg: str) -> None:
    print(f"[e2e {time.monotonic() - T0:7.1f}s] {msg}", flush=True)


def run(cmd: Sequence[str], *, timeout: float, env: dict[str, str] | None = None, check: bool = True,
        log_to: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd``; its output goes to ``log_to`` as it comes (what a killed command printed survives),
    its tail to our stdout. On timeout the command is killed and returns code -9."""
    log("$ " + " ".join(cmd))
    log_to = log_to or Path(f"/tmp/e2e-cmd-{os.getpid()}.log")
    with open(log_to, "w") as f:
        proc = subprocess.Popen(list(cmd), env=env, text=True, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log(f"timed out after {timeout:.0f} s; killing {cmd[:4]}")
            os.killpg(proc.pid, 9)
            rc = proc.wait()
    text = log_to.read_text(errors="replace")
    print("\n".join(ln for ln in text.splitlines()[-25:] if not ln.startswith("20")), flush=True)
    if check and rc != 0:
        raise RuntimeError(f"{cmd[:4]} exited {rc}")
    return subprocess.CompletedProcess(list(cmd), rc, stdout=text)


def ray_cli(*args: str) -> list[str]:
    # `pip install --target` writes no console scripts: call Ray's CLI entry point directly.
    return [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.exit(main())", *args]


RAY_TEMP_DIR = "/tmp/ray-e2e"


@contextmanager
def ray_cluster(gpus: Sequence[int], *, sim: bool, num_cpus: int) -> Iterator[None]:
    """``ray start --head`` on ``gpus`` (the sweep and deploy CLIs join it with ``--address auto``).

    The cluster listens on 127.0.0.1 only of a machine nothing else can reach, so Ray 2.60's token
    authentication is turned off (``RAY_AUTH_MODE=disabled``) rather than handing a token to every
    child process.
    """
    os.environ["RAY_AUTH_MODE"] = "disabled"
    env = dict(os.environ)
    if not sim:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    stop_ray()
    run(ray_cli("start", "--head", f"--num-gpus={len(gpus)}", f"--num-cpus={num_cpus}", "--port=6390",
                "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1", f"--temp-dir={RAY_TEMP_DIR}",
                f"--metrics-export-port={METRICS_PORT}", "--disable-usage-stats"),
        timeout=120, env=env)
    os.environ["RAY_ADDRESS"] = "127.0.0.1:6390"
    try:
        yield
    finally:
        try:
            import ray

            if ray.is_initialized():
                ray.shutdown()
        except Exception:
            pass
        stop_ray()


def stop_ray() -> None:
    """Stop *this* script's Ray (processes whose command line names its temp dir), not other Ray
    clusters on the machine (``ray stop`` would stop them all)."""
    import signal

    def ours() -> list[int]:
        pids = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == os.getpid():
                continue
            try:
                if RAY_TEMP_DIR.encode() in (d / "cmdline").read_bytes():
                    pids.append(int(d.name))
            except OSError:
                pass
        return pids

    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = ours()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        for _ in range(30):
            if not ours():
                return
            time.sleep(0.5)


# ----- phase: sweep ---------------------------------------------------------------------------------------
def sweep_cmd(a: argparse.Namespace, run_dir: Path, *, sweep_id: str, num_trials: int, share: bool,
              time_budget_s: float) -> list[str]:
    cmd = [sys.executable, "-m", "tuning.sweep", "--address", "auto", "--run-dir", str(run_dir),
           "--sweep-id", sweep_id, "--no-live", "--tp", "1", "--buckets", a.buckets,
           "--concurrency", str(a.concurrency), "--num-prompts", str(a.num_prompts),
           "--num-trials", str(num_trials), "--time-budget-s", str(time_budget_s),
           "--speculative", "false,true", "--num-draft-tokens", a.draft_tokens,
           "--memory-fraction", a.memory_fractions, "--max-batch-size", str(a.max_batch_size), "--seed", "0",
           "--repeats", str(a.repeats), "--backends", "pytorch"]
    if a.sim:
        cmd += ["--sim-profile", SIM_PROFILE, "--sim-time-scale", f"{SIM_TIME_SCALE:g}"]
    else:
        cmd += ["--model", a.ckpt, "--session-len", str(a.session_len)]
        if share:  # the budget is meant for shared engines (without sharing each tp=1 engine takes a GPU)
            cmd += ["--share-gpu"] + (["--serve-gpus", str(a.serve_gpus)] if a.serve_gpus else [])
    return cmd


def summarize_run(run_dir: Path) -> dict[str, Any]:
    import pandas as pd

    from tuning.results import primary_rows

    df = pd.read_csv(run_dir / "results.csv")
    trials = []
    for tid, g in df.groupby("trial_id"):
        ok = g[g["status"] == "ok"]
        trials.append({
            "trial_id": tid, "role": g["role"].iloc[0], "label": g["engine_label"].iloc[0],
            "status": "ok" if len(ok) else "failed", "cached": bool(g["cached"].iloc[0]),
            "engine_startup_s": _num(g["engine_startup_s"].iloc[0]) if "engine_startup_s" in g else None,
            "measured_from": ok["started_at"].min() if "started_at" in ok and len(ok) else None,
            "measured_to": ok["finished_at"].max() if "finished_at" in ok and len(ok) else None,
            # each bucket's primary row (a temperature or load sweep has more rows per bucket)
            "tput": {r["bucket"]: _num(r["output_throughput"]) for _, r in primary_rows(g).iterrows()},
            "accept_length": {r["bucket"]: _num(r.get("accept_length")) for _, r in primary_rows(g).iterrows()},
            "cpus": _num(g["cpus"].iloc[0]) if "cpus" in g else None,
            "failure": str(g["failure_reason"].dropna().iloc[0])[:400] if g["failure_reason"].notna().any() else "",
        })
    table = routing.load(run_dir / "routing_table.json") if (run_dir / "routing_table.json").exists() else None
    return {"trials": trials, "table": json.loads(table.model_dump_json()) if table else None,
            "measurement_overlaps": overlaps(trials)}


def overlaps(trials: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Pairs of trials whose measurement windows intersect (ISO timestamps compare as strings)."""
    spans = [(t["trial_id"], t["measured_from"], t["measured_to"]) for t in trials
             if t["measured_from"] and t["measured_to"] and not t["cached"]]
    return [(a, b) for i, (a, a0, a1) in enumerate(spans) for (b, b0, b1) in spans[i + 1:] if a0 < b1 and b0 < a1]


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if f != f else round(f, 3)


def phase_sweep(a: argparse.Namespace) -> dict[str, Any]:
    """The one-GPU sweep; ``--resume`` continues one a call's time limit cut short (``tuning.sweep
    --resume``: no finished trial is re-run)."""
    run_dir = Path(a.work) / "sweep-1gpu"
    if a.resume:
        cmd = [sys.executable, "-m", "tuning.sweep", "--resume", str(run_dir), "--address", "auto", "--no-live",
               "--num-trials", str(a.num_trials), "--time-budget-s", str(a.time_budget_s)]
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
        cmd = sweep_cmd(a, run_dir, sweep_id="e2e-1gpu", num_trials=a.num_trials, share=True,
                        time_budget_s=a.time_budget_s)
    gpus = [int(g) for g in a.gpus.split(",")][:1]
    with ray_cluster(gpus, sim=a.sim, num_cpus=a.num_cpus):
        t = time.monotonic()
        proc = run(cmd, timeout=a.deadline_s, check=False, log_to=Path(a.out) / "sweep_1gpu.log")
        wall = time.monotonic() - t
    out = {"phase": "sweep", "gpus": gpus, "rc": proc.returncode, "wall_s": round(wall, 1), "command": " ".join(cmd)}
    if (run_dir / "results.csv").exists():
        out.update(summarize_run(run_dir))
    pack(run_dir, Path(a.out) / "sweep_1gpu_run.tgz")
    return out


def pack(run_dir: Path, dest: Path) -> None:
    with tarfile.open(dest, "w:gz") as tar:
        tar.add(run_dir, arcname=run_dir.name,
                filter=lambda ti: None if "/experiment/" in ti.name and ti.name.endswith((".pkl", ".json.tmp")) else ti)


# ----- phase: serve ---------------------------------------------------------------------------------------
def deploy_cmd(table: Path, *, share: bool, log_dir: Path, sim: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "orchestrator.deploy", "--routing-table", str(table), "--address", "auto",
           "--http-host", "127.0.0.1", "--http-port", str(HTTP_PORT), "--app-name", APP,
           "--engine-log-dir", str(log_dir)]
    return cmd + (["--share-gpu"] if share else []) + (["--sim-time-scale", f"{SIM_TIME_SCALE:g}"] if sim else [])


def engine_infos() -> dict[str, dict[str, Any]]:
    import ray
    from ray import serve

    if not ray.is_initialized():
        ray.init(address="auto", log_to_driver=False)
    status = serve.status().applications[APP]
    out = {}
    for name in status.deployments:
        if name == "router":
            continue
        out[name] = serve.get_deployment_handle(name, app_name=APP).engine_info.remote().result(timeout_s=60)
    return out


def engine_counters(base_url: str, backend: str) -> dict[str, float]:
    import httpx

    from orchestrator.serve.metrics import parse_prometheus_text

    req_name, tok_name = ENGINE_COUNTERS[backend]
    samples = parse_prometheus_text(httpx.get(base_url + "/metrics", timeout=10).text)
    return {"requests": samples.get(req_name, 0.0), "generation_tokens": samples.get(tok_name, 0.0)}


def openai_client():
    import openai

    return openai.OpenAI(base_url=f"http://127.0.0.1:{HTTP_PORT}/v1", api_key="unused", max_retries=0, timeout=300)


def routing_check(table: routing.RoutingTable, backend: str) -> dict[str, Any]:
    """Small and large max_tokens through the official openai client (streaming and not); which
    engine's own counters moved."""
    infos = engine_infos()
    before = {k: engine_counters(v["base_url"], backend) for k, v in infos.items()}
    client = openai_client()
    model = client.models.list().data[0].id
    first, last = table.buckets[0], table.buckets[-1]
    sent = {}
    for bucket, max_tokens in ((first, max(8, first.max_output_len // 2)), (last, last.max_output_len)):
        n = 0
        for stream in (False, True):
            for _ in range(3):
                kw = dict(model=model, prompt="def fibonacci(n):", max_tokens=max_tokens, temperature=0.0,
                          extra_body={"ignore_eos": True})
                if stream:
                    for _chunk in client.completions.create(stream=True, **kw):
                        pass
                else:
                    client.completions.create(**kw)
                n += 1
        sent[bucket.name] = {"requests": n, "max_tokens": max_tokens, "engine": bucket.engine_config().key()}
    time.sleep(2)
    after = {k: engine_counters(v["base_url"], backend) for k, v in infos.items()}
    delta = {k: {m: after[k][m] - before[k][m] for m in after[k]} for k in infos}
    same_engine = first.engine_config().key() == last.engine_config().key()
    return {"sent": sent, "engine_counter_delta": delta, "same_engine_for_both": same_engine,
            "engines": {k: {"gpus": v["gpus"], "base_url": v["base_url"], "accept_length": v["accept_length"]}
                        for k, v in infos.items()}}


def prometheus_check() -> dict[str, Any]:
    import httpx

    wanted = ["ray_mtp_router_requests_total", "ray_mtp_router_output_tokens_total", "ray_mtp_router_ttft_seconds_bucket",
              "ray_mtp_router_tpot_seconds_bucket", "ray_mtp_engine_accept_length", "ray_mtp_engine_requests_running"]
    deadline = time.monotonic() + 60
    text, missing = "", wanted
    while time.monotonic() < deadline:
        try:
            text = httpx.get(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10).text
        except Exception:
            text = ""
        missing = [m for m in wanted if m not in text]
        if not missing:
            break
        time.sleep(3)
    lines = [ln for ln in text.splitlines() if ln.startswith(("ray_mtp_router_requests_total", "ray_mtp_engine_accept_length{"))]
    return {"endpoint": f"http://127.0.0.1:{METRICS_PORT}/metrics", "missing": missing, "sample_lines": lines[:12]}


def bench(url: str, workload: Any, tokenizer: Any) -> dict[str, Any]:
    from tuning.bench import benchmark

    r = benchmark(url, workload, tokenizer=tokenizer, request_timeout_s=600).to_dict()
    out = {k: r.get(k) for k in ("output_throughput", "completed", "failed", "duration_s", "total_output_tokens",
                                 "accept_length", "simulated")}
    out.update(ttft_ms_median=(r.get("ttft_ms") or {}).get("median"), tpot_ms_median=(r.get("tpot_ms") or {}).get("median"))
    return out


def mixed_requests(buckets: Sequence[Any], tokenizer: Any, seed: int = 0) -> list[tuple[str, int]]:
    """Every bucket's requests (the sweep's workloads: buckets in proportion), shuffled."""
    from tuning.workload import build_requests

    reqs = []
    for b in buckets:
        reqs += [(r.prompt, r.output_len) for r in build_requests(b.workload_at(b.primary_concurrency), tokenizer)]
    random.Random(seed).shuffle(reqs)
    return reqs


async def _closed_loop(url: str, model: str, reqs: Sequence[tuple[str, int] | tuple[str, int, float]],
                       concurrency: int) -> dict[str, Any]:
    """``reqs`` (prompt, max_tokens[, temperature: 0 when absent]) in a closed loop of ``concurrency``."""
    import aiohttp

    queue = list(reversed(reqs))
    tokens, errors, done = 0, 0, 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as s:
        async def worker() -> None:
            nonlocal tokens, errors, done
            while queue:
                prompt, max_tokens, *rest = queue.pop()
                temperature = float(rest[0]) if rest else 0.0
                body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
                        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
                try:
                    async with s.post(url + "/v1/completions", json=body) as r:
                        if r.status != 200:
                            errors += 1
                            continue
                        usage = None
                        async for line in r.content:
                            if line.startswith(b"data: {") and b'"usage"' in line:
                                obj = json.loads(line[6:])
                                usage = obj.get("usage") or usage
                        tokens += int((usage or {}).get("completion_tokens") or 0)
                        done += 1
                except Exception:
                    errors += 1

        t = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.monotonic() - t
    return {"requests": len(reqs), "completed": done, "errors": errors, "output_tokens": tokens,
            "wall_s": round(wall, 2), "output_throughput": round(tokens / wall, 1) if wall > 0 else None}


def warm_up(reqs: list[tuple[str, int]], concurrency: int) -> None:
    """One short batch per deployed engine before anything is measured (a fresh engine's first
    batches pay one-time set-up): the first ``concurrency`` requests of every length, 16 tokens each."""
    by_len = sorted(reqs, key=lambda r: r[1])
    picks = by_len[:concurrency] + by_len[len(by_len) // 2:][:concurrency] + by_len[-concurrency:]
    mixed_run([(p, 16) for p, _ in picks], concurrency)


def mixed_run(reqs: list[tuple[str, int]], concurrency: int) -> dict[str, Any]:
    client = openai_client()
    model = client.models.list().data[0].id
    return asyncio.run(_closed_loop(f"http://127.0.0.1:{HTTP_PORT}", model, reqs, concurrency))


def mixed_runs(reqs: list[tuple[str, int]], concurrency: int, repeats: int) -> dict[str, Any]:
    """The mixed workload ``repeats`` times on the same deployment: one run is ~3 waves (~10 s on an
    H200), too short to tell a few per cent; the mean and the spread say how far to trust a ratio."""
    runs = [mixed_run(reqs, concurrency) for _ in range(repeats)]
    tputs = [r["output_throughput"] for r in runs if r.get("output_throughput")]
    return {"runs": runs, "errors": sum(r["errors"] for r in runs),
            "output_throughput": round(sum(tputs) / len(tputs), 1) if len(tputs) == len(runs) else None,
            "output_throughput_range": [min(tputs), max(tputs)] if tputs else None}


def best_static(run_dir: Path, buckets: Sequence[Any], reqs: list[tuple[str, int]]) -> tuple[EngineConfig, dict]:
    """The single config with the best predicted throughput on the mixed requests ``reqs`` from the
    sweep's rows (:func:`tuning.choose.mix.predict`: the time one engine would need to serve every bucket's
    share at that bucket's measured rate)."""
    import pandas as pd

    from tuning.choose.mix import per_config_throughput, predict
    from tuning.results import config_of_row

    df = pd.read_csv(run_dir / "results.csv")
    tokens = {b.name: 0 for b in buckets}
    for _, n in reqs:
        tokens[next(b.name for b in buckets if n <= b.max_output_len)] += n
    pred = predict(per_config_throughput(df), tokens)
    key, tput = pred.best_single
    cfg = EngineConfig.from_dict(config_of_row(df[df["engine_key"] == key].iloc[0]))
    if cfg.key() != key:
        raise RuntimeError(f"rebuilt config {cfg.key()} differs from the sweep's {key}")
    return cfg, {"engine_key": key, "predicted_mixed_tput": round(tput, 1),
                 "predicted_table_cap": round(pred.ratio, 3),
                 "ranking": [(round(v, 1), k) for k, v in pred.singles[:6]]}


def static_table(table: routing.RoutingTable, cfg: EngineConfig, path: Path) -> Path:
    data = json.loads(table.model_dump_json())
    for b in data["buckets"]:
        b["config"] = cfg.to_dict()
        b.pop("cells", None)
    data["provenance"]["sweep_id"] = f"{data['provenance']['sweep_id']}-static"
    data.pop("version", None)
    routing.commit(data, path)
    return path


def serve_delete() -> None:
    from ray import serve

    serve.delete(APP)
    for _ in range(60):  # engines drain and free their GPUs
        if APP not in serve.status().applications:
            return
        time.sleep(1)


def deploy(table_path: Path, a: argparse.Namespace, *, share: bool, scale: str | None = None) -> dict[str, Any]:
    cmd = deploy_cmd(table_path, share=share, log_dir=Path(a.work) / "serve-logs", sim=a.sim)
    if scale:
        cmd += ["--scale", scale]
    t = time.monotonic()
    proc = run(cmd, timeout=420, check=False)
    return {"rc": proc.returncode, "deploy_s": round(time.monotonic() - t, 1), "command": " ".join(cmd),
            "tail": proc.stdout.splitlines()[-3:]}


def phase_serve(a: argparse.Namespace) -> dict[str, Any]:
    from tuning.workload import load_tokenizer

    run_dir = Path(a.work) / "sweep-1gpu"
    table_path = run_dir / "routing_table.json"
    table = routing.load(table_path)
    spec = json.loads((run_dir / "sweep.json").read_text())
    from tuning.buckets import Bucket

    buckets = [Bucket.from_dict(b) for b in spec["buckets"]]
    tokenizer = load_tokenizer(None if a.sim else a.ckpt)
    backend = "sim" if a.sim else "lmdeploy"
    share = not a.sim
    out: dict[str, Any] = {"phase": "serve", "table": json.loads(table.model_dump_json())}
    # Every GPU of --gpus: a table whose engines' memory fractions do not fit one GPU together
    # (deploy refuses it with a clear error) is served on two.
    gpus = [int(g) for g in a.gpus.split(",")]
    out["gpus"] = gpus
    reqs = mixed_requests(buckets, tokenizer)
    with ray_cluster(gpus, sim=a.sim, num_cpus=a.num_cpus):
        out["deploy_tuned"] = deploy(table_path, a, share=share)
        if out["deploy_tuned"]["rc"] != 0:
            return out
        # The longest bucket's workload straight to its engine before anything else has run on it,
        # as a sweep measures an engine (64 short warm-up requests, then the bucket): run 4's sweep
        # figures sat 1.2-1.5x below the same config's figures here after a mixed pass; this run and
        # the "direct" runs below, later on the same engine, tell whether the engine speeds up with use.
        infos = engine_infos()
        last = buckets[-1]
        engine_url = infos[table.buckets[-1].engine_config().key()]["base_url"]
        w = last.workload_at(last.primary_concurrency)
        out["cold_direct"] = bench(engine_url, w, tokenizer)
        log(f"cold direct ({last.name}): {out['cold_direct']}")
        warm_up(reqs, a.concurrency)
        out["routing"] = routing_check(table, backend)
        out["prometheus"] = prometheus_check()
        # Router vs straight to the engine: the longest bucket's workload at the sweep's concurrency.
        # ABBA (direct, router, router, direct): an engine's first full-length batches are slower than
        # later ones (2026-11-29: twice the direct run, done first, lost 25-35 %), so the order must
        # not favour either path; the ratio compares the means of the two runs of each.
        urls = {"direct": engine_url, "router": f"http://127.0.0.1:{HTTP_PORT}"}
        runs = [(path, bench(urls[path], w, tokenizer)) for path in ("direct", "router", "router", "direct")]
        rvd: dict[str, Any] = {"workload": w.to_dict(), "order": [p for p, _ in runs], "runs": [r for _, r in runs]}
        for path in urls:
            figs = [r for p, r in runs if p == path]
            for k in ("output_throughput", "ttft_ms_median"):
                vals = [f[k] for f in figs if f.get(k) is not None]
                rvd[f"{path}_{k}_mean"] = round(sum(vals) / len(vals), 2) if len(vals) == len(figs) else None
        if rvd["direct_output_throughput_mean"] and rvd["router_output_throughput_mean"]:
            rvd["ratio"] = round(rvd["router_output_throughput_mean"] / rvd["direct_output_throughput_mean"], 3)
        if rvd["direct_ttft_ms_median_mean"] is not None and rvd["router_ttft_ms_median_mean"] is not None:
            rvd["added_ttft_ms_median"] = round(rvd["router_ttft_ms_median_mean"] - rvd["direct_ttft_ms_median_mean"], 2)
        out["router_vs_direct"] = rvd
        out["mixed_tuned"] = mixed_runs(reqs, a.concurrency, a.mixed_repeats)
        n_engines = len(table.distinct_configs())
        log(f"tuned table: {out['mixed_tuned']}")
        serve_delete()

        cfg, pick = best_static(run_dir, buckets, reqs)
        out["static_pick"] = pick
        if cfg is None:
            return out
        if set(table.distinct_configs()) == {cfg.key()}:
            # The tuned table is one engine of the best single config: the deployment just measured
            # *is* the static one, so the ratio is 1 by construction (no second deploy of it).
            out["static_is_the_tuned_table"] = True
            out["mixed_static_1"] = out["mixed_tuned"]
        st_path = static_table(table, cfg, Path(a.work) / "static_table.json")
        # The fair comparison first: the best single config on as many engines as the tuned table
        # had (same GPU share, same engine count), then the same config as one engine.
        for name, scale in dict.fromkeys(((f"static_{n_engines}", f"default={n_engines}" if n_engines > 1 else None),
                                          ("static_1", None))):
            if f"mixed_{name}" in out or time.monotonic() - T0 > a.deadline_s - 150:
                continue
            out[f"deploy_{name}"] = deploy(st_path, a, share=share, scale=scale)
            if out[f"deploy_{name}"]["rc"] == 0:
                warm_up(reqs, a.concurrency)
                out[f"mixed_{name}"] = mixed_runs(reqs, a.concurrency, a.mixed_repeats)
                log(f"{name}: {out[f'mixed_{name}']}")
                serve_delete()
    tuned = out["mixed_tuned"]["output_throughput"]
    for k in [k for k in out if k.startswith("mixed_static_")]:
        if tuned and out[k].get("output_throughput"):
            out[f"ratio_tuned_vs_{k[6:]}"] = round(tuned / out[k]["output_throughput"], 3)
    return out


# ----- phase: two GPUs ------------------------------------------------------------------------------------
def phase_two_gpu(a: argparse.Namespace) -> dict[str, Any]:
    gpus = [int(g) for g in a.gpus.split(",")][:2]
    run_dir = Path(a.work) / "sweep-2gpu"
    shutil.rmtree(run_dir, ignore_errors=True)
    out: dict[str, Any] = {"phase": "two-gpu", "gpus": gpus}
    with ray_cluster(gpus, sim=a.sim, num_cpus=a.num_cpus):
        cmd = sweep_cmd(a, run_dir, sweep_id="e2e-2gpu", num_trials=a.two_gpu_trials, share=False,
                        time_budget_s=60)
        t = time.monotonic()
        proc = run(cmd, timeout=min(330, a.deadline_s), check=False, log_to=Path(a.out) / "sweep_2gpu.log")
        out["sweep"] = {"rc": proc.returncode, "wall_s": round(time.monotonic() - t, 1), "command": " ".join(cmd),
                        **summarize_run(run_dir)}
        pack(run_dir, Path(a.out) / "sweep_2gpu_run.tgz")

        # One bucket served by a tp=2 engine: its replica reserves both GPUs, the engine runs on them.
        tp2 = EngineConfig(backend="sim" if a.sim else "pytorch", model=SIM_PROFILE if a.sim else a.ckpt, tp=2,
                           speculative_algorithm="qwen3_5_mtp", num_draft_tokens=3, memory_fraction=0.5,
                           max_batch_size=a.max_batch_size,
                           session_len=None if a.sim else a.session_len,
                           extra_flags=() if a.sim else ("--language-model-only",))
        data = {"provenance": {"model": tp2.model, "gpu_type": "H200", "gpu_count": 2, "sweep_id": "e2e-tp2",
                               "created_at": utc_now_iso(), "simulated": a.sim},
                "buckets": [{"name": "le2048", "max_output_len": 2048, "config": tp2.to_dict(),
                             "figures": {"output_throughput": 1.0}}]}
        path = Path(a.work) / "tp2_table.json"
        routing.commit(data, path)
        out["tp2_deploy"] = deploy(path, a, share=False)
        if out["tp2_deploy"]["rc"] == 0:
            import ray

            infos = engine_infos()
            out["tp2_engine"] = next(iter(infos.values()))
            out["tp2_engine"].pop("engine_metrics", None)
            out["cluster_gpus_available_while_serving"] = ray.available_resources().get("GPU", 0.0)
            client = openai_client()
            model = client.models.list().data[0].id
            r = client.completions.create(model=model, prompt="import os\n", max_tokens=64, temperature=0.0)
            out["tp2_completion_tokens"] = r.usage.completion_tokens if r.usage else None
            if not a.sim:
                smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv"],
                                     capture_output=True, text=True, timeout=30)
                out["nvidia_smi_compute_apps"] = smi.stdout.splitlines()
            serve_delete()
    return out


# ----- CLI ------------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("phase", choices=["sweep", "serve", "two-gpu"])
    p.add_argument("--ckpt", default="/root/ckpt")
    p.add_argument("--out", required=True)
    p.add_argument("--work", default="/root/e2e", help="state kept between phases (same machine)")
    p.add_argument("--gpus", default="0")
    p.add_argument("--sim", action="store_true", help="dry run on the simulated engine (no GPU)")
    p.add_argument("--resume", action="store_true", help="sweep: continue the sweep in --work (after a cut-off call)")
    p.add_argument("--buckets", default="256,1024,2048")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--num-trials", type=int, default=8)
    p.add_argument("--two-gpu-trials", type=int, default=2)
    p.add_argument("--mixed-repeats", type=int, default=3, help="serve: runs of the mixed workload per deployment")
    p.add_argument("--repeats", type=int, default=1,
                   help="sweeps: runs of each bucket per engine (run 3 measured run-to-run noise with 2; with the "
                        "clean lease, 2 no longer fit one call)")
    p.add_argument("--serve-gpus", type=int, default=None,
                   help="pass --serve-gpus N to the shared-GPU sweep (commit a table that fits N GPUs; e.g. 1 "
                        "to serve the one-GPU sweep's table on that GPU)")
    p.add_argument("--draft-tokens", default="1,2,3,4")
    p.add_argument("--memory-fractions", default="0.03,0.06",
                   help="searched fractions; with --share-gpu a trial reserves its fraction + 0.1 of the GPU, so "
                        "0.03 / 0.06 let all six search trials of an 8-trial sweep start together (run 4's "
                        "0.05-0.15 allowed four: a second round of start-ups did not fit one call). 0.03 of an "
                        "H200 is ~4 GB of KV, far more than the test checkpoint uses")
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--session-len", type=int, default=4096)
    p.add_argument("--time-budget-s", type=float, default=None,
                   help="sweep: no trial starts its engine after this (default: --deadline-s minus 150 s, one "
                        "start-up and measurement, so the call ends by itself instead of being killed mid-trial)")
    p.add_argument("--deadline-s", type=float, default=560)
    p.add_argument("--num-cpus", type=int, default=max(2, len(os.sched_getaffinity(0)) - 2),
                   help="Ray's logical CPUs (default: the CPUs this process may use, e.g. under taskset, minus 2)")
    a = p.parse_args(argv)
    if a.time_budget_s is None:
        a.time_budget_s = max(30.0, a.deadline_s - 150)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    Path(a.work).mkdir(parents=True, exist_ok=True)
    fn = {"sweep": phase_sweep, "serve": phase_serve, "two-gpu": phase_two_gpu}[a.phase]
    result: dict[str, Any] = {"phase": a.phase, "error": None}
    try:
        result.update(fn(a))
    except Exception as e:
        import traceback

        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc()[-3000:]
        log(result["traceback"])
    result["simulated"] = a.sim
    # Which host: the same configs measured 1.5x apart on two x2 machines (runs 2 and 4, both pinned
    # to 16 cores); a small model's engine is CPU-bound, so the host CPU is the first thing to compare.
    from orchestrator.hostinfo import measured_on

    result["host"] = {**measured_on(), "cpu_count": os.cpu_count()}
    result["elapsed_s"] = round(time.monotonic() - T0, 1)
    dest = Path(a.out) / f"e2e_{a.phase.replace('-', '_')}.json"
    dest.write_text(json.dumps(result, indent=2, default=str))
    log(f"wrote {dest}: error={result['error']}")
    return 0 if result["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
