"""Router overhead: the Serve router in front of a simulated engine vs the same engine called directly.

    python -m benchmarks.router_overhead [--concurrency 64] [--requests 256] [--max-tokens 512]
        [--time-scale 1] [--soak-streams 256] [--soak-seconds 60]
        [--engine-transport grpc|object_ref] [--proxy-grpc] [--throughput-optimized] [--direct-ingress]
        [--out-dir DIR | --out benchmarks/results/router_overhead]

Three runs, one after another (never concurrently, so they don't compete for CPU):

1. *direct*: a closed loop of ``--concurrency`` streaming completions straight to an engine
   (``EngineProcess``, simulated, on 127.0.0.1);
2. *router*: the same load through the Serve app (HTTP proxy -> router -> handle stream -> engine
   replica -> engine), single bucket, same engine config and time scale;
3. *soak*: ``--soak-streams`` concurrent streams through the router for ``--soak-seconds``; every
   request must succeed.

All times are wall-clock, measured by the client (the simulator's own figures are in simulated time
and are not used). Output throughput = completion tokens (from the usage chunk) / wall time of the run.
Writes ``<out>.json`` and ``<out>.md`` (``--out-dir DIR``: ``DIR/router_overhead.json`` and ``.md``).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.sim_serve import (
    MODEL,
    SIM_MTP3,
    add_serve_arguments,
    apply_serve_env,
    serve_settings,
    served_sim_table,
)
from benchmarks.sim_serve import prompts as sample_prompts
from orchestrator.engine import EngineProcess
from orchestrator.fsutil import utc_now_iso

ROOT = Path(__file__).resolve().parents[1]

API_KEY = "sk-bench"


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds a process has used (``/proc/PID/stat``), ``None`` once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_per_request(pids: dict[str, int], run: Any) -> tuple[Any, dict[str, float | None]]:
    """Run ``run()`` and return its result with the CPU milliseconds each process in ``pids`` spent
    per request of it: a figure that CPU contention from other jobs changes much less than latency."""
    before = {k: _cpu_s(p) for k, p in pids.items()}
    result = run()
    n = max(1, result["requests"])
    out: dict[str, float | None] = {}
    for k, p in pids.items():
        after = _cpu_s(p)
        out[k] = None if after is None or before[k] is None else round(1000 * (after - before[k]) / n, 2)
    return result, out


async def _one(session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int, headers: dict) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}, "temperature": 0}
    t0 = time.perf_counter()
    first = None
    tokens = 0
    try:
        async with session.post(url, json=body, headers=headers) as resp:
            if resp.status != 200:
                return {"ok": False, "error": f"HTTP {resp.status}: {(await resp.text())[:200]}"}
            async for line in resp.content:
                if not line.startswith(b"data: {"):
                    continue
                if first is None and b'"text"' in line:
                    first = time.perf_counter()
                if b'"usage": {' in line or b'"usage":{' in line:
                    tokens = json.loads(line[6:])["usage"]["completion_tokens"]
                if b'"error"' in line:
                    return {"ok": False, "error": line[:200].decode(errors="replace")}
    except Exception as e:  # recorded, never raised: one failure must not stop the run
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    end = time.perf_counter()
    return {"ok": tokens > 0, "ttft_s": (first or end) - t0, "tokens": tokens, "start": t0, "end": end,
            "error": None if tokens > 0 else "no usage"}


async def closed_loop(url: str, *, concurrency: int, requests: int | None, seconds: float | None,
                      max_tokens: int, prompts: list[str], headers: dict) -> dict[str, Any]:
    """``concurrency`` workers, each sending one request after another, until ``requests`` are done
    or ``seconds`` have passed."""
    results: list[dict[str, Any]] = []
    deadline = None if seconds is None else time.perf_counter() + seconds
    counter = iter(range(10**9))
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        async def worker() -> None:
            while True:
                i = next(counter)
                if requests is not None and i >= requests:
                    return
                if deadline is not None and time.perf_counter() >= deadline:
                    return
                results.append(await _one(session, url, prompts[i % len(prompts)], max_tokens, headers))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    ok = [r for r in results if r["ok"]]
    errors: dict[str, int] = {}
    for r in results:
        if not r["ok"]:
            errors[r["error"][:80]] = errors.get(r["error"][:80], 0) + 1
    ttfts = sorted(r["ttft_s"] * 1000 for r in ok)
    return {
        "requests": len(results), "completed": len(ok), "failed": len(results) - len(ok), "errors": errors,
        "wall_s": round(wall, 3),
        "output_tokens": sum(r["tokens"] for r in ok),
        "output_throughput": round(sum(r["tokens"] for r in ok) / wall, 1),
        "ttft_ms_median": round(statistics.median(ttfts), 2) if ttfts else None,
        "ttft_ms_p99": round(ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))], 2) if ttfts else None,
    }


def run_label(r: dict[str, Any]) -> str:
    """Column name of one run: the Serve path it measured."""
    serve = r.get("serve") or {}
    parts = [f'engine stream over {serve.get("engine_transport", "object_ref")}']
    if serve.get("proxy_grpc"):
        parts.append("proxy over gRPC")
    if serve.get("direct_ingress"):
        parts.append("direct ingress (no proxy)")
    parts.append("throughput-optimized" if r.get("throughput_optimized") else "Serve defaults")
    return ", ".join(parts)


def markdown(results: list[dict[str, Any]], notes: str = "") -> str:
    """A results page: one column per run (e.g. Serve default vs RAY_SERVE_THROUGHPUT_OPTIMIZED=1)."""
    r0 = results[0]
    names = [run_label(r) for r in results]
    rows = [
        ("output tok/s, direct (c=%d)" % r0["settings"]["concurrency"], lambda r: f'{r["direct"]["output_throughput"]:.0f}'),
        ("output tok/s, via router", lambda r: f'{r["router"]["output_throughput"]:.0f}'),
        ("**throughput ratio** (goal >= 0.97)", lambda r: f'**{r["throughput_ratio"]:.3f}**'),
        ("median TTFT direct / router, ms", lambda r: f'{r["direct"]["ttft_ms_median"]:.1f} / {r["router"]["ttft_ms_median"]:.1f}'),
        ("**added median TTFT, ms** (goal <= 5)", lambda r: f'**{r["added_ttft_ms_median"]:.1f}**'),
        ("added median TTFT, one request at a time, ms", lambda r: f'{r["added_ttft_ms_median_idle"]:.1f}'),
        ("Serve CPU per request: proxy / router / engine replica, ms", lambda r: " / ".join(
            f'{(r["router"].get("cpu_ms_per_request") or {}).get(k) or "-"}' for k in ("proxy", "router", "engine_replica"))),
        ("soak: %d streams x %gs: completed / failed" % (r0["settings"]["soak_streams"], r0["settings"]["soak_seconds"]),
         lambda r: f'{r["soak"]["completed"]} / **{r["soak"]["failed"]}**'),
        ("soak output tok/s, median TTFT ms", lambda r: f'{r["soak"]["output_throughput"]:.0f}, {r["soak"]["ttft_ms_median"]:.0f}'),
        ("host load average after the run (1/5/15 min)", lambda r: " / ".join(f"{x:.1f}" for x in r["load_average_after"])),
    ]
    lines = ["# Router overhead (simulated engines)", "",
             "Commands: `" + "`, `".join(r["command"] for r in results) + "`", "",
             f'Versions: {", ".join(f"{k} {v}" for k, v in r0["versions"].items())}. '
             f'Machine: {r0["machine"]["cpus"]} CPU cores ({len(r0["machine"].get("cpus_allowed") or []) or "all"} allowed to this run), '
             f'no GPU used ({r0["machine"]["platform"]}).', "",
             f'Workload: streaming `/v1/completions`, {r0["settings"]["input_tokens"]}-token prompts, '
             f'max_tokens={r0["settings"]["max_tokens"]} with ignore_eos, {r0["settings"]["requests"]} requests in a closed loop; '
             f'engine: simulator profile `{r0["settings"]["engine_config"]["model"]}` with MTP (3 draft tokens), '
             f'time scale {r0["settings"]["time_scale"]:g}. All times are wall-clock at the client.', "",
             "| | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(results)]
    lines += [f"| {label} | " + " | ".join(fn(r) for r in results) + " |" for label, fn in rows]
    lines += ["", notes] if notes else []
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--input-tokens", type=int, default=256)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--soak-streams", type=int, default=256)
    p.add_argument("--soak-seconds", type=float, default=60.0)
    p.add_argument("--idle-requests", type=int, default=30, help="sequential requests for the unloaded TTFT probe")
    add_serve_arguments(p)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "router_overhead"))
    a = p.parse_args()
    apply_serve_env(a)

    import ray

    config = SIM_MTP3
    prompts = sample_prompts(64, a.input_tokens)
    tmp = Path(tempfile.mkdtemp(prefix="router-bench-"))
    headers_direct: dict[str, str] = {}
    headers_router = {"authorization": f"Bearer {API_KEY}"}
    run = dict(concurrency=a.concurrency, requests=a.requests, seconds=None, max_tokens=a.max_tokens, prompts=prompts)
    # One request at a time: the router's own added latency without queueing behind a burst.
    idle = dict(concurrency=1, requests=a.idle_requests, seconds=None, max_tokens=16, prompts=prompts)

    # 1. direct
    with EngineProcess(config, log_dir=tmp / "direct-logs", sim_time_scale=a.time_scale, served_model_name=MODEL) as eng:
        url = eng.base_url + "/v1/completions"
        asyncio.run(closed_loop(url, **{**run, "requests": a.concurrency}, headers=headers_direct))  # warm-up
        direct = asyncio.run(closed_loop(url, **run, headers=headers_direct))
        direct_idle = asyncio.run(closed_loop(url, **idle, headers=headers_direct))
    print("direct:", json.dumps(direct), "\ndirect idle:", json.dumps(direct_idle))

    # 2. router, 3. soak
    with served_sim_table(config, work_dir=tmp, api_key=API_KEY, time_scale=a.time_scale,
                          num_cpus=a.num_cpus, app_name="bench", engine_transport=a.engine_transport, direct_ingress=a.direct_ingress) as url:
        asyncio.run(closed_loop(url, **{**run, "requests": a.concurrency}, headers=headers_router))  # warm-up
        from benchmarks.soak_router import find_pids

        pids = find_pids("bench")
        router, router_cpu = cpu_per_request(pids, lambda: asyncio.run(closed_loop(url, **run, headers=headers_router)))
        router["cpu_ms_per_request"] = router_cpu
        print("router CPU ms per request:", json.dumps(router_cpu))
        router_idle = asyncio.run(closed_loop(url, **idle, headers=headers_router))
        print("router:", json.dumps(router), "\nrouter idle:", json.dumps(router_idle))
        soak = asyncio.run(closed_loop(url, concurrency=a.soak_streams, requests=None, seconds=a.soak_seconds,
                                       max_tokens=a.max_tokens, prompts=prompts, headers=headers_router))
        print("soak:", json.dumps(soak))

    ratio = router["output_throughput"] / direct["output_throughput"] if direct["output_throughput"] else None
    added_ttft = (router["ttft_ms_median"] - direct["ttft_ms_median"]) if direct["ttft_ms_median"] is not None else None
    import fastapi
    import pydantic

    result = {
        "command": " ".join(["python", "benchmarks/router_overhead.py", *sys.argv[1:]]),
        "settings": vars(a) | {"engine_config": config.to_dict()},
        "versions": {"python": platform.python_version(), "ray": ray.__version__, "fastapi": fastapi.__version__,
                     "pydantic": pydantic.__version__, "aiohttp": aiohttp.__version__},
        "machine": {"cpus": os.cpu_count(), "cpus_allowed": sorted(os.sched_getaffinity(0)),
                    "platform": platform.platform(), "processor": platform.processor()},
        "direct": direct, "router": router, "soak": soak, "direct_idle": direct_idle, "router_idle": router_idle,
        "added_ttft_ms_median_idle": round(router_idle["ttft_ms_median"] - direct_idle["ttft_ms_median"], 2),
        "throughput_ratio": round(ratio, 4) if ratio else None,
        "added_ttft_ms_median": round(added_ttft, 2) if added_ttft is not None else None,
        "goals": {"throughput_ratio_min": 0.97, "added_ttft_ms_max": 5.0, "soak_errors": 0},
        "met": {
            "throughput_ratio": bool(ratio and ratio >= 0.97),
            "added_ttft": bool(added_ttft is not None and added_ttft <= 5.0),
            "soak_zero_errors": soak["failed"] == 0 and soak["completed"] > 0,
        },
        "throughput_optimized": a.throughput_optimized,
        "serve": serve_settings(a),
        "load_average_after": os.getloadavg(),
        "finished_at": utc_now_iso(),
    }
    out = Path(a.out_dir) / "router_overhead" if a.out_dir else Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown([result]))
    print(json.dumps({k: result[k] for k in ("throughput_ratio", "added_ttft_ms_median", "added_ttft_ms_median_idle", "met")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
