"""A routing table that mixes a TurboMind replica with a PyTorch-engine MTP replica, served on one GPU
through Ray Serve (issue #19 item 5): it deploys, each request goes where the table says (the router's
``x-route-*`` headers, and each engine's own LMDeploy counters agree), both replicas pass Serve's health
checks and one is replaced after ``kill -9`` of its engine, and Ray's metrics endpoint carries the
router's series per cell and each engine's re-exported figures.

The table is written here, not by a sweep: on the test checkpoint TurboMind outruns the PyTorch engine
3-4x in every cell measured (``benchmarks/results/gpu_engine_grid_h200_2026-12-01.md``), so a sweep
commits TurboMind alone. What this run checks is the serving path of a mixed table — the one a sweep
commits where MTP wins greedy traffic and loses sampled traffic (the shape measured on the H200 for
MTP vs MTP off): short outputs to TurboMind; long greedy outputs to PyTorch MTP-2; long sampled outputs
to TurboMind (a cell).

    python -m benchmarks.gpu.serve_engines --ckpt /root/ckpt --out $OUT            # on the GPU machine
    python -m benchmarks.gpu.serve_engines --sim --out /tmp/se                     # the same flow, simulated
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.gpu import e2e  # the e2e run's Ray cluster, deploy and engine helpers
from benchmarks.gpu.e2e import APP, METRICS_PORT, log
from orchestrator import table as routing
from orchestrator.config import EngineConfig
from orchestrator.fsutil import utc_now_iso
from orchestrator.serve.metrics import DRAFTS, parse_prometheus_text

SIM_PROFILE = "qwen35-test-83m-1xh200"
GRID = "benchmarks/results/gpu_engine_grid_h200_2026-12-01.md"
# Each request kind: (max_tokens, temperature or None, the engine the table must send it to).
KINDS = {
    "short-greedy": (64, 0.0, "turbomind"),
    "short-sampled": (64, 0.8, "turbomind"),
    "long-greedy": (512, 0.0, "mtp"),
    "long-sampled": (512, 0.8, "turbomind"),
    "long-no-temperature": (512, None, "mtp"),
}
REPEATS = 4  # per kind: two non-streaming, two streaming


def engine_configs(ckpt: str, sim: bool) -> dict[str, EngineConfig]:
    if sim:
        base = EngineConfig(backend="sim", model=SIM_PROFILE, memory_fraction=0.1, max_batch_size=64, session_len=4096)
        tm = base.replace(simulated_backend="turbomind")
    else:
        base = EngineConfig(backend="pytorch", model=ckpt, memory_fraction=0.1, max_batch_size=64, session_len=4096,
                            extra_flags=("--language-model-only",))
        tm = base.replace(backend="turbomind")
    return {"turbomind": tm, "mtp": base.replace(speculative_algorithm="qwen3_5_mtp", num_draft_tokens=2)}


def write_table(path: Path, cfgs: dict[str, EngineConfig], *, model: str, sim: bool) -> routing.RoutingTable:
    """The mixed table; its figures are the H200 grid's (output 512, concurrency 64) for what they are."""
    src = {"source": GRID, "note": "written by benchmarks/gpu/serve_engines.py for the serving check, not chosen by a sweep"}
    tm, mtp = cfgs["turbomind"].to_dict(), cfgs["mtp"].to_dict()
    return routing.commit({
        "provenance": {"model": model, "gpu_type": "none (simulated)" if sim else "NVIDIA H200", "gpu_count": 0 if sim else 1,
                       "sweep_id": "mixed-engines-serving-check", "created_at": utc_now_iso(), "simulated": sim,
                       "workload": src},
        "buckets": [
            {"name": "le256", "max_output_len": 256, "config": tm, "figures": {"output_throughput": 34483.0}},
            {"name": "le2048", "max_output_len": 2048, "config": mtp, "figures": {"output_throughput": 14119.0},
             "cells": [{"sampling": "sampled", "min_in_flight": 1, "config": tm,
                        "figures": {"output_throughput": 34483.0}}]},
        ],
        "default_max_tokens": 256,
    }, path)


def engine_counters(url: str) -> dict[str, float]:
    import httpx

    samples = parse_prometheus_text(httpx.get(url + "/metrics", timeout=10).text)
    requests, tokens = e2e.ENGINE_COUNTERS["sim" if "sim_requests_total" in samples else "lmdeploy"]
    names = {"requests": requests, "generation_tokens": tokens, "drafts": DRAFTS}
    return {k: samples.get(v, 0.0) for k, v in names.items()} | {"_names": sorted(samples)}


def send(kind: str, stream: bool, model: str) -> dict[str, Any]:
    max_tokens, temperature, _ = KINDS[kind]
    client = e2e.openai_client()
    kw: dict[str, Any] = dict(model=model, prompt="def fibonacci(n):", max_tokens=max_tokens,
                              extra_body={"ignore_eos": True})
    if temperature is not None:
        kw["temperature"] = temperature
    if stream:
        with client.completions.with_streaming_response.create(stream=True, **kw) as resp:
            headers = dict(resp.headers)
            chunks = sum(1 for line in resp.iter_lines() if line.startswith("data: {"))
        got = {"chunks": chunks}
    else:
        raw = client.completions.with_raw_response.create(**kw)
        headers = dict(raw.headers)
        got = {"completion_tokens": raw.parse().usage.completion_tokens}
    return {"kind": kind, "stream": stream, **got,
            **{h[len("x-route-"):]: v for h, v in headers.items() if h.startswith("x-route-")}}


def routing_check(cfgs: dict[str, EngineConfig], infos: dict[str, dict[str, Any]]) -> dict[str, Any]:
    keys = {name: cfg.key() for name, cfg in cfgs.items()}
    urls = {name: infos[key]["base_url"] for name, key in keys.items()}
    model = e2e.openai_client().models.list().data[0].id
    before = {name: engine_counters(u) for name, u in urls.items()}
    sent = [send(kind, stream, model) for _ in range(REPEATS // 2) for kind in KINDS for stream in (False, True)]
    time.sleep(3)  # LMDeploy's metrics logger updates its counters off the request path
    after = {name: engine_counters(u) for name, u in urls.items()}
    wrong = [s for s in sent if s.get("deployment") != keys[KINDS[s["kind"]][2]]]
    routed = Counter(name for s in sent for name, key in keys.items() if s.get("deployment") == key)
    moved = {name: {k: after[name][k] - before[name][k] for k in ("requests", "generation_tokens", "drafts")}
             for name in urls}
    metric_names = {name: after[name].pop("_names") for name in urls}
    for b in before.values():
        b.pop("_names")
    counters_agree = all(moved[name]["requests"] == routed[name] for name in urls)
    return {"deployments": keys, "sent": sent, "misrouted": wrong, "routed": dict(routed), "engine_counter_delta": moved,
            "counters_agree_with_routing": counters_agree,
            "drafts_only_on_mtp": moved["mtp"]["drafts"] > 0 and moved["turbomind"]["drafts"] == 0,
            "metric_names_only_in": {"turbomind": sorted(set(metric_names["turbomind"]) - set(metric_names["mtp"])),
                                     "mtp": sorted(set(metric_names["mtp"]) - set(metric_names["turbomind"]))}}


def ray_metrics(keys: dict[str, str]) -> dict[str, Any]:
    """Ray's metrics endpoint: the router's request series by cell and each engine's gauges."""
    import httpx

    deadline, lines = time.monotonic() + 90, []
    want = ["ray_mtp_router_requests_total", "ray_mtp_engine_requests_running", "ray_mtp_engine_accept_length"]
    while time.monotonic() < deadline:
        try:
            text = httpx.get(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10).text
        except Exception:
            text = ""
        lines = [ln for ln in text.splitlines() if ln.startswith(tuple(want))]
        engines_seen = {k for k in keys.values() if any(f'engine="{k}"' in ln for ln in lines)}
        if all(any(ln.startswith(w) for ln in lines) for w in want) and engines_seen == set(keys.values()):
            return {"ok": True, "lines": lines}
        time.sleep(3)
    return {"ok": False, "lines": lines}


def health_check(cfgs: dict[str, EngineConfig], victim: str, model: str) -> dict[str, Any]:
    """``kill -9`` of ``victim``'s engine: Serve's health check marks the replica unhealthy and replaces
    it; then requests of that engine's kind are served by the new replica."""
    from ray import serve

    key = cfgs[victim].key()
    old = e2e.engine_infos()[key]
    os.kill(old["pid"], signal.SIGKILL)
    t0, seen = time.monotonic(), []
    while time.monotonic() - t0 < 420:
        status = serve.status().applications[APP].deployments[key].status.value
        if not seen or seen[-1][1] != status:
            seen.append((round(time.monotonic() - t0, 1), status))
        if len(seen) > 1 and status == "HEALTHY":
            break
        time.sleep(1)
    new = e2e.engine_infos()[key]
    # The router learns the replacement from its own health view, a few seconds later: until then the
    # victim's requests fall back to a healthy bucket (x-route-fallback) instead of failing.
    kind = next(k for k, v in KINDS.items() if v[2] == victim)
    t1, after = time.monotonic(), []
    while time.monotonic() - t1 < 120:
        after.append(send(kind, False, model) | {"t_s": round(time.monotonic() - t0, 1)})
        if after[-1].get("deployment") == key:
            break
        time.sleep(2)
    return {"victim": key, "old_pid": old["pid"], "new_pid": new["pid"], "status_changes": seen,
            "replaced": new["pid"] != old["pid"] and seen[-1][1] == "HEALTHY",
            "requests_after": after, "served_by_victim_config": after[-1].get("deployment") == key}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", default="/root/ckpt")
    p.add_argument("--out", required=True)
    p.add_argument("--work", default="/root/serve-engines")
    p.add_argument("--sim", action="store_true", help="the same flow on simulated engines (no GPU)")
    p.add_argument("--num-cpus", type=int, default=8)
    a = p.parse_args(argv)
    out_dir, work = Path(a.out), Path(a.work)
    out_dir.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    cfgs = engine_configs(a.ckpt, a.sim)
    table_path = work / "routing_table.json"
    write_table(table_path, cfgs, model=SIM_PROFILE if a.sim else a.ckpt, sim=a.sim)
    result: dict[str, Any] = {"simulated": a.sim, "table": json.loads(table_path.read_text()), "started": utc_now_iso()}
    with e2e.ray_cluster([0], sim=a.sim, num_cpus=a.num_cpus):
        result["deploy"] = e2e.deploy(table_path, argparse.Namespace(work=str(work), sim=a.sim), share=not a.sim)
        if result["deploy"]["rc"] == 0:
            from ray import serve

            infos = e2e.engine_infos()
            result["engines"] = {k: {f: v[f] for f in ("base_url", "pid", "gpus", "alive")} for k, v in infos.items()}
            result["serve_status"] = {k: d.status.value for k, d in serve.status().applications[APP].deployments.items()}
            log(f"deployed: {result['serve_status']}")
            result["routing"] = routing_check(cfgs, infos)
            log(f"routing: misrouted {len(result['routing']['misrouted'])}, counters {result['routing']['engine_counter_delta']}")
            result["ray_metrics"] = ray_metrics(result["routing"]["deployments"])
            model = e2e.openai_client().models.list().data[0].id
            result["health"] = health_check(cfgs, "turbomind", model)
            log(f"health: {result['health']['status_changes']} replaced={result['health']['replaced']}")
            e2e.serve_delete()
    result["ok"] = bool(result.get("routing") and not result["routing"]["misrouted"]
                        and result["routing"]["counters_agree_with_routing"] and result["routing"]["drafts_only_on_mtp"]
                        and result["ray_metrics"]["ok"] and result["health"]["replaced"]
                        and result["health"]["served_by_victim_config"])
    (out_dir / "serve_engines.json").write_text(json.dumps(result, indent=1, default=str))
    log(f"ok={result['ok']}; written {out_dir / 'serve_engines.json'}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
