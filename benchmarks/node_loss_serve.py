"""Losing a node while serving: requests, errors and replicas over time (SIMULATED engines).

A multi-node Ray cluster on this one machine (``ray.cluster_utils.Cluster``: a head without GPUs and
three raylets declaring 8 GPUs each), the Serve app of a three-bucket routing table (one engine
deployment per bucket, one replica each, the router as ingress), closed-loop streaming clients on
every bucket, and at ``--loss-at-s`` the raylet holding one bucket's only engine replica (not the
router's) is killed with everything it started, as a lost machine would be. Recorded per request: when
it started and ended, its bucket, the deployment that answered, the fallback header, and how it ended
(``ok``, ``error_event`` — a stream cut with an SSE error, ``http_<status>``, ``truncated`` — a stream
that ended without a finish reason, or ``client_error``). Recorded every half second: the running
replicas of each deployment and the nodes their processes run on.

Where a process runs is read from the process itself: every raylet is started with
``MTP_TEST_NODE=<label>``, which Ray's workers (Serve replicas) inherit from their raylet.

    python benchmarks/node_loss_serve.py --out benchmarks/results/multinode_node_loss_serve

writes ``<out>.json`` (everything) and ``<out>.md`` (the summary and the per-second table). Figures are
wall-clock seconds on this machine with simulated engines: they show behaviour (what fails, what
falls back, when the replica is back), not GPU latencies.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from orchestrator import onehost
from orchestrator.config import EngineConfig
from orchestrator.hostinfo import git_commit
from orchestrator.sim.model import DEFAULT_PROFILE

ROOT = Path(__file__).resolve().parent.parent
NODE_ENV = "MTP_TEST_NODE"
APP = "mtp-node-loss"
PROFILE = DEFAULT_PROFILE
OFF = {"backend": "sim", "model": PROFILE, "tp": 8}
BUCKET_CONFIGS = {
    "le256": OFF,
    "le1024": {**OFF, "speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": 2},
    "le4096": {**OFF, "speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": 4},
}
DEPLOYMENTS = ("router", *(EngineConfig(**c).key() for c in BUCKET_CONFIGS.values()))
REQUEST_TOKENS = {"le256": 200, "le1024": 800, "le4096": 1500}
"""Output tokens each client asks for per bucket (``ignore_eos``): inside the bucket, seconds long."""


# ----- where processes run (/proc) ---------------------------------------------------------------------------
def replicas_by_node(app: str = APP) -> dict[str, list[str]]:
    return onehost.replicas_by_node(app, DEPLOYMENTS, NODE_ENV)


def running_replicas(app: str = APP) -> dict[str, int]:
    return onehost.running_replicas(app)


# ----- requests ------------------------------------------------------------------------------------------------
@dataclass
class RequestRecord:
    client: int
    bucket: str
    start_s: float
    end_s: float
    outcome: str
    deployment: str | None
    fallback: str | None
    chunks: int
    detail: str = ""


def _one_request(http: Any, url: str, bucket: str, client: int, t0: float) -> RequestRecord:
    import httpx

    body = {"model": PROFILE, "prompt": "Tell me about Ray.", "max_tokens": REQUEST_TOKENS[bucket], "stream": True,
            "ignore_eos": True}
    start = time.monotonic() - t0
    chunks, finish, outcome, detail, dep, fallback = 0, None, "", "", None, None
    try:
        with http.stream("POST", f"{url}/v1/completions", json=body) as r:
            dep, fallback = r.headers.get("x-route-deployment"), r.headers.get("x-route-fallback")
            if r.status_code != 200:
                outcome, detail = f"http_{r.status_code}", r.read().decode(errors="replace")[:300]
            else:
                event = None
                for line in r.iter_lines():
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:"):
                        data = line[5:].strip()
                        if event == "error":
                            outcome, detail = "error_event", data[:300]
                        elif data != "[DONE]":
                            chunks += 1
                            try:
                                choice = (json.loads(data).get("choices") or [{}])[0]
                            except ValueError:
                                choice = {}
                            finish = choice.get("finish_reason") or finish
                if not outcome:
                    outcome = "ok" if finish else "truncated"
    except httpx.HTTPError as e:
        outcome, detail = "client_error", f"{type(e).__name__}: {e}"[:300]
    return RequestRecord(client, bucket, round(start, 3), round(time.monotonic() - t0, 3), outcome, dep, fallback,
                         chunks, detail)


def _client(url: str, bucket: str, client: int, t0: float, stop: threading.Event, out: list[RequestRecord]) -> None:
    import httpx

    with httpx.Client(timeout=120) as http:
        while not stop.is_set():
            out.append(_one_request(http, url, bucket, client, t0))


# ----- the run -------------------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    from orchestrator import table as routing
    from orchestrator.config import EngineConfig
    from orchestrator.fsutil import utc_now_iso
    from orchestrator.ports import find_free_port
    from orchestrator.serve.app import build_app

    work = Path(tempfile.mkdtemp(prefix="mtp-node-loss-"))
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={
        "num_cpus": 0, "num_gpus": 0, "include_dashboard": False, "env_vars": {NODE_ENV: "head"},
        "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3,
                           "health_check_timeout_ms": 1000},
    })
    nodes = {}
    try:
        for i in range(3):
            nodes[f"gpu-{i}"] = cluster.add_node(num_cpus=2, num_gpus=8, env_vars={NODE_ENV: f"gpu-{i}"})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        table_path = work / "routing_table.json"
        routing.commit({
            "provenance": {"model": PROFILE, "gpu_type": "none (simulated)", "gpu_count": 0, "sweep_id": "node-loss",
                           "created_at": utc_now_iso(), "simulated": True},
            "buckets": [{"name": b, "max_output_len": int(b[2:]), "config": EngineConfig(**c).to_dict(),
                         "figures": {"output_throughput": 1000.0}} for b, c in BUCKET_CONFIGS.items()],
            "default_max_tokens": 64,
        }, table_path)
        keys = {b: EngineConfig(**c).key() for b, c in BUCKET_CONFIGS.items()}
        port = find_free_port()
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app({
            "routing_table": str(table_path), "sim_time_scale": args.time_scale,
            "engine": {"log_dir": str(work / "engine-logs"), "health_check_period_s": 1.0,
                       "health_check_timeout_s": 3.0, "health_timeout_s": 1.0, "graceful_shutdown_timeout_s": 5.0},
            "router": {"num_cpus": 0, "status_refresh_s": 0.5},
        }), name=APP, route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        placed = replicas_by_node()
        while not (placed.get("router") and all(len(placed.get(k, [])) == 1 for k in keys.values())):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the app's replicas did not all start: {placed}")
            time.sleep(0.5)
            placed = replicas_by_node()
        victim_bucket, victim_node = next((b, placed[k][0]) for b, k in reversed(keys.items())
                                          if placed[k][0] not in ("head", placed["router"][0]))
        print(f"placement: {placed}; will lose {victim_node} (only replica of {victim_bucket}) at "
              f"t={args.loss_at_s:g} s", flush=True)

        t0 = time.monotonic()
        stop = threading.Event()
        records: list[RequestRecord] = []
        samples: list[dict[str, Any]] = []
        clients = [threading.Thread(target=_client, args=(url, b, i, t0, stop, records), daemon=True)
                   for i, b in enumerate(b for b in keys for _ in range(args.clients_per_bucket))]
        for c in clients:
            c.start()
        lost_at = None
        while (now := time.monotonic() - t0) < args.duration_s:
            if lost_at is None and now >= args.loss_at_s:
                cluster.remove_node(nodes.pop(victim_node), allow_graceful=False)
                lost_at = (round(now, 3), round(time.monotonic() - t0, 3))  # the kill began, and returned
                print(f"t={lost_at[0]:.1f}-{lost_at[1]:.1f} s: {victim_node} removed", flush=True)
            samples.append({"t_s": round(now, 2), "running": running_replicas(), "nodes": replicas_by_node()})
            done = len(records)
            print(f"t={now:5.1f} s  requests done {done:4d}  running replicas {samples[-1]['running']}", flush=True)
            time.sleep(0.5)
        stop.set()
        for c in clients:
            c.join(timeout=120)
    finally:
        try:
            serve.shutdown()
        except Exception:
            pass
        ray.shutdown()
        cluster.shutdown()
    return summarise(args, records, samples, keys, victim_bucket, victim_node, lost_at, placed)


def summarise(args: argparse.Namespace, records: Sequence[RequestRecord], samples: Sequence[dict[str, Any]],
              keys: dict[str, str], victim_bucket: str, victim_node: str, lost_at: tuple[float, float] | None,
              placed: dict[str, list[str]]) -> dict[str, Any]:
    victim_key = keys[victim_bucket]
    begin, end = lost_at if lost_at is not None else (float("inf"), float("inf"))
    in_flight = [r for r in records if r.start_s < begin < r.end_s]
    during = [r for r in records if begin <= r.start_s < end]
    after = [r for r in records if r.start_s >= end]
    back = next((s["t_s"] for s in samples if s["t_s"] > end
                 and s["running"].get(victim_key) == 1
                 and any(n != victim_node for n in s["nodes"].get(victim_key, []))), None)
    per_second = []
    for sec in range(int(args.duration_s) + 1):
        started = [r for r in records if sec <= r.start_s < sec + 1]
        ended = [r for r in records if sec <= r.end_s < sec + 1]
        sample = next((s for s in samples if s["t_s"] >= sec), samples[-1] if samples else {"running": {}})
        per_second.append({
            "t_s": sec, "started": len(started), "ended_ok": sum(r.outcome == "ok" for r in ended),
            "ended_error": sum(r.outcome != "ok" for r in ended),
            "fallbacks": sum(1 for r in ended if r.fallback),
            "replicas": {b: sample["running"].get(k, 0) for b, k in keys.items()},
        })
    victim_after = [r for r in after if r.bucket == victim_bucket]
    summary = {
        "requests": len(records),
        "outcomes": {o: sum(r.outcome == o for r in records) for o in sorted({r.outcome for r in records})},
        "lost_node": victim_node, "lost_bucket": victim_bucket, "lost_deployment": victim_key,
        "lost_at_s": list(lost_at) if lost_at else None,
        "in_flight_at_loss": len(in_flight),
        "in_flight_at_loss_on_lost_node": sum(r.deployment == victim_key for r in in_flight),
        "in_flight_on_lost_node_outcomes": sorted({r.outcome for r in in_flight if r.deployment == victim_key}),
        "in_flight_elsewhere_failed": sum(r.outcome != "ok" for r in in_flight if r.deployment != victim_key),
        "started_while_the_node_was_killed": len(during),
        "started_while_the_node_was_killed_outcomes": {o: sum(r.outcome == o for r in during)
                                                       for o in sorted({r.outcome for r in during})},
        "started_after_loss": len(after),
        "started_after_loss_failed": sum(r.outcome != "ok" for r in after),
        "lost_bucket_after_loss": {
            "requests": len(victim_after),
            "fallbacks": sum(1 for r in victim_after if r.fallback),
            "answered_by_own_deployment": sum(r.deployment == victim_key for r in victim_after),
            "first_3_latencies_s": [round(r.end_s - r.start_s, 2) for r in victim_after[:3]],
        },
        "replica_back_on_other_node_at_s": back,
        "placement_before": placed,
        "placement_after": samples[-1]["nodes"] if samples else {},
    }
    return {"summary": summary, "per_second": per_second, "requests": [asdict(r) for r in records],
            "samples": list(samples)}


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "platform": platform.platform(), "cpus": str(os.cpu_count())}
    for pkg in ("ray", "mtp-autotune", "httpx"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    out["git_commit"] = git_commit(ROOT) or "unknown"
    try:
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
        if dirty:
            out["git_commit"] += f" + uncommitted changes to {len(dirty.splitlines())} tracked file(s)"
    except (OSError, subprocess.CalledProcessError):
        pass  # outside git: the commit already says so
    return out


def write(result: dict[str, Any], out: Path, command: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"simulated": True, "command": command, "versions": _versions(), **result}
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    s = result["summary"]
    lines = [
        "# Losing a node while serving (SIMULATED engines, one host)", "",
        f"Command: `{command}`  ", f"Versions: {json.dumps(result['versions'])}", "",
        "Cluster: `ray.cluster_utils.Cluster` on one machine, a head without GPUs and 3 raylets x 8 GPUs; "
        "the Serve app of a 3-bucket table (one engine replica per bucket, simulated engines); closed-loop "
        "streaming clients on every bucket. Wall-clock seconds of this machine, not GPU figures.", "",
        "## Summary", "",
        f"- requests: {s['requests']}; outcomes: {s['outcomes']}",
        f"- lost node `{s['lost_node']}` (the kill ran from t = {s['lost_at_s'][0]} to {s['lost_at_s'][1]} s): "
        f"the only replica of `{s['lost_bucket']}`",
        f"- started while the node was being killed: {s['started_while_the_node_was_killed']} "
        f"({s['started_while_the_node_was_killed_outcomes']})",
        f"- in flight at the loss: {s['in_flight_at_loss']}, of which on the lost node: "
        f"{s['in_flight_at_loss_on_lost_node']} (ended: {s['in_flight_on_lost_node_outcomes']}); "
        f"in flight elsewhere that failed: {s['in_flight_elsewhere_failed']}",
        f"- started after the loss: {s['started_after_loss']}, failed: {s['started_after_loss_failed']}",
        f"- `{s['lost_bucket']}` after the loss: {s['lost_bucket_after_loss']}",
        f"- replica back on another node at t = {s['replica_back_on_other_node_at_s']} s",
        f"- placement before: {s['placement_before']}", f"- placement after: {s['placement_after']}", "",
        "## Per second", "", "| t (s) | started | ended ok | ended with error | fallbacks | replicas "
        + " / ".join(result["per_second"][0]["replicas"]) + " |", "|---:|---:|---:|---:|---:|---|",
    ]
    lines += [f"| {r['t_s']} | {r['started']} | {r['ended_ok']} | {r['ended_error']} | {r['fallbacks']} | "
              + " / ".join(str(v) for v in r["replicas"].values()) + " |" for r in result["per_second"]]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/node_loss_serve.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration-s", type=float, default=40.0, help="how long the clients run")
    p.add_argument("--loss-at-s", type=float, default=10.0, help="when the node is removed")
    p.add_argument("--clients-per-bucket", type=int, default=2)
    p.add_argument("--time-scale", type=float, default=1.0, help="simulated engines run this much faster")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "multinode_node_loss_serve"),
                   help="output path without suffix (.json and .md are written)")
    args = p.parse_args(argv)
    if not 0 < args.loss_at_s < args.duration_s:
        p.error("--loss-at-s must lie inside --duration-s")
    result = run(args)
    out = Path(args.out)
    write(result, out, "python " + " ".join([os.path.relpath(__file__, ROOT), *(argv if argv is not None else sys.argv[1:])]))
    s = result["summary"]
    print(f"\n{s['requests']} requests {s['outcomes']}; in flight on the lost node: "
          f"{s['in_flight_at_loss_on_lost_node']} -> {s['in_flight_on_lost_node_outcomes']}; started after the loss "
          f"failed: {s['started_after_loss_failed']}/{s['started_after_loss']}; replica back at "
          f"t={s['replica_back_on_other_node_at_s']} s\nwrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
